"""What the engine's fork server imports once, so that each engine process it forks starts with it:
the libraries that load a 4-bit verifier, quietly (engine/worker.py PRELOAD)."""

from .loading import silence_library_noise
from .quantization import import_bitsandbytes

silence_library_noise()  # transformers' and bitsandbytes' warnings off
import_bitsandbytes()  # its compile wrappers deferred (quantization.py)
