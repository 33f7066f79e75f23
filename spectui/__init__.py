"""spectui: a terminal chat on SpecInfer-style tree speculation, with the token tree on screen."""

__version__ = "0.1.0"
