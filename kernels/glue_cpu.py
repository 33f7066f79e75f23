"""kernels/glue_cpu.c from Python: a LLaMA layer's glue in one call where torch takes several ops.

`glue()` gives a Glue where the library builds (kernels/native.py: x86 with AVX2, a C compiler,
SPECTUI_CPU_KERNELS not 0), else None and callers keep their torch ops. Its functions give the
bits of the torch ops they replace (the C file says why; tests/kernels/test_glue_cpu.py checks them
bit for bit), so LeanModel's logits stay CachedModel's. Two of them depend on torch's own kernels
and are checked against torch before use, falling back to torch's ops: the sum of squares (once per
row length) and silu, which calls torch's own exp (once, at load).

Two flavours, by what the 4-bit layers read: bf16 rows for kernels/packed_4bit.c (AVX512-BF16:
the norms and silu * up round to bf16 as they write, silu with torch's AVX512 exp) and fp32 rows for
kernels/nf4_cpu.c (AVX2 CPUs: no rounding, silu with torch's AVX2 exp, Sleef_expf8_u10).
"""

from __future__ import annotations

import ctypes as ct
import functools
from pathlib import Path

import torch

from . import native

I64, PTR = ct.c_int64, ct.c_void_p
# spectui_rms_scale(rows, n, h, sumsq, eps, w, out, bf16_out)
RMS_ARGS = [I64, I64, PTR, PTR, ct.c_float, PTR, PTR, ct.c_int]
# spectui_rope_store(T, Hq, Hkv, D, qkv, ldqkv, cos, sin, q, k, v, ld)
ROPE_ARGS = [I64, I64, I64, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR, I64]
# spectui_silu_mul_bf16(T, I, gate_up, ld, out, exp16), spectui_silu_mul_f32(T, I, gate_up, ld, out, exp8)
SILU_ARGS = [I64, I64, PTR, I64, PTR, PTR]


SUM_ROWS = 64  # rows a norm takes its sum of squares from C (beyond: torch's, which may split rows among threads)


def rms_reference(h: torch.Tensor, weight: torch.Tensor, eps: float, dtype=torch.bfloat16) -> torch.Tensor:
    """transformers' LlamaRMSNorm in fp32, then the rounding to `dtype`: what rms_norm_bf16 (rms_norm_f32) must equal."""
    return (weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


class Glue:
    def __init__(self, rms, rope, silu=None, silu_f32=None) -> None:
        self._rms, self._rope = rms, rope
        self._sum_checked: dict[tuple[int, bool], bool] = {}  # (row length, fp32 out) -> the C sum of squares is torch's
        self._silu, self._exp16 = (silu, torch_exp(("AVX512",), "Sleef_expf16_u10")) if silu is not None else (None, None)
        if self._exp16 is None or not self._silu_matches_torch(self.silu_mul_bf16, torch.bfloat16):
            self._silu = None  # silu_mul_bf16 keeps torch's ops
        self._silu_f32, self._exp8 = (silu_f32, torch_exp(("AVX2", "AVX512"), "Sleef_expf8_u10")) if silu_f32 is not None else (None, None)
        if self._exp8 is None or not self._silu_matches_torch(self.silu_mul_f32, torch.float32):
            self._silu_f32 = None  # silu_mul_f32 keeps torch's ops

    @staticmethod
    def _silu_matches_torch(silu_mul, dtype) -> bool:
        """The C silu against torch's on 64k values over 2^-10 .. 2^10 and the edges, bit for bit."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 1024, generator=g) * torch.exp2(torch.randint(-10, 11, (64, 1), generator=g).float())
        x[0, :16] = torch.tensor([0.0, -0.0, 88.0, -88.0, 100.0, -100.0, 1e-40, 3e38, -3e38, 20.0, -20.0,
                                  87.3, -87.3, 103.0, -103.0, 5.0])
        want = (torch.nn.functional.silu(x[:, :512]) * x[:, 512:]).to(dtype)
        return torch.equal(bits(silu_mul(x)), bits(want))

    def silu_mul_bf16(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] fp32 (rows contiguous) -> (silu(gate) * up).to(bfloat16) [T, I], torch's bits
        (torch's ops where the C path is off)."""
        return self._silu_mul(gate_up, self._silu, self._exp16, 16, torch.bfloat16)

    def silu_mul_f32(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The same in an fp32 model (nf4_cpu.c): silu(gate) * up [T, I] fp32, no rounding after."""
        return self._silu_mul(gate_up, self._silu_f32, self._exp8, 8, torch.float32)

    @staticmethod
    def _silu_mul(gate_up: torch.Tensor, fn, exp, lanes: int, dtype) -> torch.Tensor:
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        if fn is None or I % lanes:
            gate, up = gate_up.chunk(2, dim=-1)
            return (torch.nn.functional.silu(gate) * up).to(dtype)
        out = torch.empty(T, I, dtype=dtype)
        fn(T, I, gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), exp)
        return out

    def rms_norm_bf16(self, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """LlamaRMSNorm of fp32 rows h [N, H] with fp32 weight [H], rounded to bf16 as the 4-bit
        kernel reads it: (weight * (h * rsqrt(mean(h^2) + eps))).to(bfloat16) -> [N, H] bf16."""
        return self._rms_norm(h, weight, eps, fp32=False)

    def rms_norm_f32(self, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """The same in an fp32 model whose 4-bit layers read fp32 rows (nf4_cpu.c): no rounding after."""
        return self._rms_norm(h, weight, eps, fp32=True)

    def _rms_norm(self, h: torch.Tensor, weight: torch.Tensor, eps: float, fp32: bool) -> torch.Tensor:
        """The sum of squares stays torch's (its summation order is the reference's) unless the C one
        was found equal; torch's mean on CPU is that sum divided by H, which the C side does."""
        rows, n = h.shape
        sumsq = None if rows <= SUM_ROWS and self._sum_matches_torch(n, fp32) else h.pow(2).sum(-1)  # [N] fp32
        out = torch.empty(h.shape, dtype=torch.float32 if fp32 else torch.bfloat16)
        self._rms(rows, n, h.data_ptr(), None if sumsq is None else sumsq.data_ptr(), eps, weight.data_ptr(),
                  out.data_ptr(), int(not fp32))
        return out

    def _sum_matches_torch(self, n: int, fp32: bool) -> bool:
        """Whether the C sum of squares gives torch's bits for rows of n (checked once per n and
        flavour, on rows of 1, 2 and SUM_ROWS at many scales; the fp32 flavour's check sees every bit
        of the result, the bf16 one's only what survives the rounding): the order is fixed, so equal
        here is equal always."""
        if (n, fp32) not in self._sum_checked:
            g = torch.Generator().manual_seed(n)
            ok = True
            dtype = torch.float32 if fp32 else torch.bfloat16
            for rows in (1, 2, SUM_ROWS):
                h = torch.randn(rows, n, generator=g) * torch.exp2(torch.randint(-20, 20, (rows, 1), generator=g).float())
                w = torch.ones(n)
                want = rms_reference(h, w, 1e-5, dtype)
                got = torch.empty(rows, n, dtype=dtype)
                self._rms(rows, n, h.data_ptr(), None, 1e-5, w.data_ptr(), got.data_ptr(), int(not fp32))
                ok &= torch.equal(bits(got), bits(want))
            self._sum_checked[n, fp32] = ok
        return self._sum_checked[n, fp32]

    def fp32_addresses(self, n: int) -> tuple[int, int, int, int] | None:
        """The addresses of rms_scale, rope_store, silu_mul_f32 and torch's exp for it, for a caller that
        makes the fp32 flavour's calls itself on rows of n with the C sum of squares (kernels/stack_cpu.c);
        None where those calls would not give torch's bits (the silu or the sum of squares for n failed
        its check)."""
        if self._silu_f32 is None or not self._sum_matches_torch(n, True):
            return None
        return (*(ct.cast(fn, ct.c_void_p).value for fn in (self._rms, self._rope, self._silu_f32)), self._exp8)

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


def torch_exp(capabilities: tuple[str, ...], name: str) -> int | None:
    """The address of libtorch_cpu's `name` (Sleef_expf16_u10: torch's exp for 16 floats on AVX512
    CPUs; Sleef_expf8_u10: for 8, on AVX2 CPUs and on AVX512 ones, where torch's own silu runs the 16-lane
    exp and the C silu's bits are checked against it), or None where torch's kernels are none of the
    `capabilities` or the library does not export it."""
    if torch.backends.cpu.get_cpu_capability() not in capabilities:
        return None
    try:
        lib = ct.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ct.cast(getattr(lib, name), ct.c_void_p).value
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
    silu_f32, _ = native.function("glue_cpu", "spectui_silu_mul_f32", SILU_ARGS)
    return Glue(rms, rope, silu, silu_f32) if rms is not None and rope is not None else None
