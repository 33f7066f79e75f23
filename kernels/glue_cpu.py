"""kernels/glue_cpu.c from Python: a LLaMA layer's glue in one call where torch takes several ops.

`glue()` gives a Glue where the library builds (kernels/native.py: x86 with AVX2, a C compiler,
SPECTUI_CPU_KERNELS not 0), else None and callers keep their torch ops. Its functions give the
bits of the torch ops they replace (the C file says why; tests/kernels/test_glue_cpu.py checks them
bit for bit), so LeanModel's logits stay CachedModel's. Two of them depend on torch's own kernels
and are checked against torch before use, falling back to torch's ops: the sum of squares (once per
row length) and silu, which calls torch's AVX512 exp (once, at load).
"""

from __future__ import annotations

import ctypes as ct
import functools
from pathlib import Path

import torch

from . import native

I64, PTR = ct.c_int64, ct.c_void_p
# spectui_rms_scale(rows, n, h, sumsq, eps, w, out)
RMS_ARGS = [I64, I64, PTR, PTR, ct.c_float, PTR, PTR]
# spectui_rope_store(T, Hq, Hkv, D, qkv, ldqkv, cos, sin, q, k, v, ld)
ROPE_ARGS = [I64, I64, I64, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR, I64]
# spectui_silu_mul_bf16(T, I, gate_up, ld, out, exp16)
SILU_ARGS = [I64, I64, PTR, I64, PTR, PTR]


SUM_ROWS = 64  # rows a norm takes its sum of squares from C (beyond: torch's, which may split rows among threads)


def rms_reference(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in fp32, then the bf16 rounding: what rms_norm_bf16 must equal."""
    return (weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))).to(torch.bfloat16)


class Glue:
    def __init__(self, rms, rope, silu=None) -> None:
        self._rms, self._rope = rms, rope
        self._sum_checked: dict[int, bool] = {}  # row length -> the C sum of squares is torch's
        self._silu, self._exp16 = (silu, torch_expf16()) if silu is not None else (None, None)
        if self._exp16 is None or not self._silu_matches_torch():
            self._silu = None  # silu_mul_bf16 keeps torch's ops

    def _silu_matches_torch(self) -> bool:
        """The C silu against torch's on 64k values over 2^-10 .. 2^10 and the edges, bit for bit."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 1024, generator=g) * torch.exp2(torch.randint(-10, 11, (64, 1), generator=g).float())
        x[0, :16] = torch.tensor([0.0, -0.0, 88.0, -88.0, 100.0, -100.0, 1e-40, 3e38, -3e38, 20.0, -20.0,
                                  87.3, -87.3, 103.0, -103.0, 5.0])
        want = (torch.nn.functional.silu(x[:, :512]) * x[:, 512:]).to(torch.bfloat16)
        return torch.equal(self.silu_mul_bf16(x).view(torch.int16), want.view(torch.int16))

    def silu_mul_bf16(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] fp32 (rows contiguous) -> (silu(gate) * up).to(bfloat16) [T, I], torch's bits
        (torch's ops where the C path is off)."""
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        if self._silu is None or I % 16:
            gate, up = gate_up.chunk(2, dim=-1)
            return (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        out = torch.empty(T, I, dtype=torch.bfloat16)
        self._silu(T, I, gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), self._exp16)
        return out

    def rms_norm_bf16(self, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """LlamaRMSNorm of fp32 rows h [N, H] with fp32 weight [H], rounded to bf16 as the 4-bit
        kernel reads it: (weight * (h * rsqrt(mean(h^2) + eps))).to(bfloat16) -> [N, H] bf16.
        The sum of squares stays torch's (its summation order is the reference's); torch's mean on
        CPU is that sum divided by H, which the C side does."""
        rows, n = h.shape
        sumsq = None if rows <= SUM_ROWS and self._sum_matches_torch(n) else h.pow(2).sum(-1)  # [N] fp32
        out = torch.empty(h.shape, dtype=torch.bfloat16)
        self._rms(rows, n, h.data_ptr(), None if sumsq is None else sumsq.data_ptr(), eps, weight.data_ptr(),
                  out.data_ptr())
        return out

    def _sum_matches_torch(self, n: int) -> bool:
        """Whether the C sum of squares gives torch's bits for rows of n (checked once per n, on rows
        of 1, 2 and SUM_ROWS at many scales): the order is fixed, so equal here is equal always."""
        if n not in self._sum_checked:
            g = torch.Generator().manual_seed(n)
            ok = True
            for rows in (1, 2, SUM_ROWS):
                h = torch.randn(rows, n, generator=g) * torch.exp2(torch.randint(-20, 20, (rows, 1), generator=g).float())
                w = torch.ones(n)
                want = rms_reference(h, w, 1e-5)
                got = torch.empty(rows, n, dtype=torch.bfloat16)
                self._rms(rows, n, h.data_ptr(), None, 1e-5, w.data_ptr(), got.data_ptr())
                ok &= torch.equal(got.view(torch.int16), want.view(torch.int16))
            self._sum_checked[n] = ok
        return self._sum_checked[n]

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


def torch_expf16() -> int | None:
    """The address of Sleef_expf16_u10 in libtorch_cpu (torch's exp for 16 floats on AVX512 CPUs), or
    None where torch's kernels are not the AVX512 ones or the library does not export it."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None
    try:
        lib = ct.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ct.cast(lib.Sleef_expf16_u10, ct.c_void_p).value
    except (OSError, AttributeError):
        return None


def glue() -> Glue | None:
    """This process's Glue (its silu checked once), or None where the library is not built or
    SPECTUI_CPU_KERNELS=0."""
    return None if native.disabled() else _glue()


@functools.lru_cache(maxsize=1)
def _glue() -> Glue | None:
    rms, _ = native.function("glue_cpu", "spectui_rms_scale", RMS_ARGS)
    rope, _ = native.function("glue_cpu", "spectui_rope_store", ROPE_ARGS)
    silu, _ = native.function("glue_cpu", "spectui_silu_mul_bf16", SILU_ARGS)
    return Glue(rms, rope, silu) if rms is not None and rope is not None else None
