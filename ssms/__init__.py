"""Boost-tuned SSMs shipped with spectui for the embedded verifier (how they were made: README.md)."""
