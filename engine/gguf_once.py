"""Parse a GGUF file once per conversion (engine/embedded.py `convert_gguf`).

transformers' GGUF loader (5.x) reads a file's metadata three times for one conversion, for the
tokenizer, the config and the weights, each time with a new `gguf.GGUFReader` that walks every
field in Python (SmolLM2's 49k-token vocabulary is most of it). It also rebuilds gguf's tensor-name
table once per module of the model, 397 times for SmolLM2-135M. Within `gguf_parsed_once()` both
are memoised: one reader per (path, mode), one name table per (architecture, layers). transformers
imports both names from `gguf` at call time, which is what makes the swap reach it. The folder it
writes is byte-identical. On a 2-vCPU EPYC the embedded model's conversion took 9.2 s instead of 18.7.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    try:
        import gguf
    except ImportError:  # transformers says what is missing
        yield
        return
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], object] = {}

    def read_once(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
        readers.clear()  # the readers' memory maps close with them
