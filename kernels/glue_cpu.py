"""kernels/glue_cpu.c from Python: a LLaMA layer's glue in one call where torch takes several ops.

`glue()` gives a Glue where the library builds (kernels/native.py: x86 with AVX2, a C compiler,
SPECTUI_CPU_KERNELS not 0), else None and callers keep their torch ops. Both functions give the
bits of the torch ops they replace (the C file says why; tests/kernels/test_glue_cpu.py checks it
bit for bit), so LeanModel's logits stay CachedModel's.
"""

from __future__ import annotations

import ctypes as ct

import torch

from . import native

I64, PTR = ct.c_int64, ct.c_void_p
# spectui_rms_scale(rows, n, h, sumsq, eps, w, out)
RMS_ARGS = [I64, I64, PTR, PTR, ct.c_float, PTR, PTR]
# spectui_rope_store(T, Hq, Hkv, D, qkv, ldqkv, cos, sin, q, k, v, ld)
ROPE_ARGS = [I64, I64, I64, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR, I64]


class Glue:
    def __init__(self, rms, rope) -> None:
        self._rms, self._rope = rms, rope

    def rms_norm_bf16(self, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """LlamaRMSNorm of fp32 rows h [N, H] with fp32 weight [H], rounded to bf16 as the 4-bit
        kernel reads it: (weight * (h * rsqrt(mean(h^2) + eps))).to(bfloat16) -> [N, H] bf16.
        The sum of squares stays torch's (its summation order is the reference's); torch's mean on
        CPU is that sum divided by H, which the C side does."""
        sumsq = h.pow(2).sum(-1)  # [N] fp32
        out = torch.empty(h.shape, dtype=torch.bfloat16)
        self._rms(h.shape[0], h.shape[1], h.data_ptr(), sumsq.data_ptr(), eps, weight.data_ptr(), out.data_ptr())
        return out

    def rope_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                   k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """qkv [T, (Hq + 2 Hkv) * D] fp32 (rows contiguous); cos, sin [T, D] fp32 contiguous; k, v:
        the cache's [Hkv, T', D] views for these T positions (T' >= T, rows of D contiguous).
        Rotates q and k (apply_rotary_pos_emb), writes k and v into the cache, returns q [1, Hq, T, D]."""
        T, D = cos.shape
        q = torch.empty(1, heads, T, D, dtype=torch.float32)
        self._rope(T, heads, kv_heads, D, qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(),
                   q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0))
        return q


def glue() -> Glue | None:
    rms, _ = native.function("glue_cpu", "spectui_rms_scale", RMS_ARGS)
    rope, _ = native.function("glue_cpu", "spectui_rope_store", ROPE_ARGS)
    return Glue(rms, rope) if rms is not None and rope is not None else None
