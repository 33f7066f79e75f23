"""Quantization of the verifier: bitsandbytes' config for a --quant, its compute path on the CPU, and
quantized copies in the model cache (quantize once, load the 4-bit weights after).

bitsandbytes quantizes a model's weights on every load (on CPU about 2 s of a 6 s start for the
embedded 135M model, ~15 ms per million weights), and the result depends only on the weights, the
quantization and the library versions. So the first load on the CPU writes the quantized model
(`save_pretrained`: packed 4-bit weights, their quantization state, the unquantized rest) to

    models_dir/quantized/<source folder name>-<quant>-<key>/

and later loads read it back (0.6 s here): the same tensors, bit for bit (tests/engine/
test_quantization.py compares state dicts and logits). The key hashes what the result depends
on: the source folder's path and its weight and config files (size and mtime), the quantization,
the compute dtype and the versions of bitsandbytes and transformers. A copy whose marker is missing
(half written) or which fails to load is quantized and written again; writing a new copy removes
older copies of the same source and quantization. Writing is best effort: a cache that cannot be
written costs only the time saved.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

FOLDER = "quantized"  # under the model cache
MARKER = "spectui-quantized.json"  # written last: the copy is complete
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def import_bitsandbytes():
    """bitsandbytes, imported with its torch.compile wrappers made at their first call.

    At import, bitsandbytes 0.50 wraps a few default-backend ops in torch.compile (a 4-bit dequantize
    among them), and building such a wrapper imports torch's inductor to read its config: about 2.8 s
    of a `spectui generate` start on a 2-core CPU (13.4-16.1 s before, 11.5-12.8 s after, three
    interleaved pairs), paid by every process that loads a 4-bit model, for ops the engine's CPU path
    does not call (its 4-bit products are kernels/nf4_cpu.c's or bitsandbytes' fused CPU ones). While
    bitsandbytes imports, torch.compile returns a stand-in that builds the real wrapper when first
    called, so a call compiles as before (torch.compile compiles at the first call anyway) and
    bitsandbytes' own fallback to the plain function still applies."""
    if "bitsandbytes" in sys.modules:
        return sys.modules["bitsandbytes"]
    real = torch.compile

    def deferred(fn=None, **options):
        if fn is None:  # used as @torch.compile(**options)
            return lambda f: deferred(f, **options)
        built = []

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not built:
                built.append(real(fn, **options))
            return built[0](*args, **kwargs)
        return call

    torch.compile = deferred
    try:
        import bitsandbytes
    finally:
        torch.compile = real
    return bitsandbytes


def cache_key(folder: Path, quant: str, dtype) -> str:
    """12 hex digits naming what a quantized copy of `folder` depends on."""
    import transformers

    bitsandbytes = import_bitsandbytes()
    parts = [str(Path(folder).resolve()), quant, str(dtype), bitsandbytes.__version__, transformers.__version__]
    for path in sorted(Path(folder).iterdir()):
        if path.suffix in WEIGHT_SUFFIXES or path.name == "config.json":
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def copies_of(root: Path, source: Path, quant: str | None = None) -> list[Path]:
    """The complete quantized copies under `root` made from `source` or a folder inside it (a hub
    repository's snapshots), of `quant` or any."""
    source, found = Path(source).resolve(), []
    for marker in sorted(Path(root).glob(f"*/{MARKER}")):
        try:
            info = json.loads(marker.read_text(encoding="utf-8"))
            made_from = Path(info["source"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (made_from == source or source in made_from.parents) and quant in (None, info.get("quant")):
            found.append(marker.parent)
    return found


def load_quantized(folder: Path, quant: str, dtype, root: Path | None, load: Callable[[Path, bool], object]):
    """The model of `folder` quantized with `quant`: `load(path, quantize)` from the copy under `root`
    when there is a sound one (quantize=False), else from `folder` (quantize=True), then kept there."""
    if root is None:
        return load(folder, True)
    key = cache_key(folder, quant, dtype)
    copy = Path(root) / f"{Path(folder).name}-{quant}-{key}"
    if (copy / MARKER).is_file():
        try:
            return load(copy, False)
        except Exception:  # noqa: BLE001 - a damaged copy: quantize again and replace it
            shutil.rmtree(copy, ignore_errors=True)
    model = load(folder, True)
    keep(model, folder, quant, key, copy)
    return model


def keep(model, source: Path, quant: str, key: str, copy: Path) -> None:
    """Write `model` to `copy` (through a temporary folder beside it, renamed when complete) and
    remove older copies of the same source and quantization; any failure leaves no copy."""
    work = None
    try:
        stale = copies_of(copy.parent, source, quant) if copy.parent.is_dir() else []
        copy.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".quantize-", dir=copy.parent))
        model.save_pretrained(work / "model")
        info = {"source": str(Path(source).resolve()), "quant": quant, "key": key}
        (work / "model" / MARKER).write_text(json.dumps(info), encoding="utf-8")
        for old in stale:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(copy, ignore_errors=True)
        (work / "model").rename(copy)
    except Exception:  # noqa: BLE001 - best effort (a full disk, a format save_pretrained refuses): no copy
        pass
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def keep_fp32_compute(model) -> None:
    """Run 4-bit layers through dequantise + fp32 matmul on CPU.

    On CPUs with AVX512-BF16, bitsandbytes repacks 4-bit weights at the first forward and then
    computes in bf16 whatever compute dtype was asked for (3-6x faster than dequantising every
    weight to fp32 on every forward). Rounding activations to bf16 magnifies any difference in
    the last bits between a tree pass and a one-token pass, and SDPA has such differences, so
    near-ties would flip. With the "exact" attention there are none (kernels/exact_attention.py)
    and the fused path stays; any other attention keeps this fp32 path.
    """
    bnb = import_bitsandbytes()
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def quant_config(quant: str):
    from transformers import BitsAndBytesConfig

    # float32 compute on CUDA too. There transformers' `generate` (SDPA attention, one-token passes
    # through bitsandbytes' 4-bit GEMV) and the engine (the Triton tree kernel; tree passes through
    # dequantize + GEMM) sum in different orders, and in bf16 that rounding flips near-ties: on a
    # random LLaMA-7B in NF4 (H100, 2026-11-27, docs/gpu.md) each config, incremental included, left
    # bf16 `generate` on some prompt within 8-28 tokens; with fp32 compute all gave its tokens.
    # Lossless first; drafters stay bf16 (loading.drafter_dtype).
    compute = torch.float32
    if quant in ("nf4", "fp4", "int8"):
        import_bitsandbytes()  # before transformers imports it: its compile wrappers deferred
    if quant in ("nf4", "fp4"):
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant, bnb_4bit_compute_dtype=compute)
    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None
