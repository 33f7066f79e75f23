"""The output screen's product from an int8 copy of the output layer (kernels/screen_int8.c).

The argmax screen (argmax_head.py) reads its copy of the output layer once a step: 49,152 x 576 for
SmolLM2, 56.6 MB in bf16, about 2.3 ms on two cores of an AMD EPYC, a fifth of a one-token step.
In int8 it is 28.3 MB. With AVX512-VNNI, vpdpbusd multiplies 64 byte pairs an instruction, so the
product stays at the speed of reading the bytes. The C loop takes 4 layer rows by 2 input rows a
pass, so a tree's rows cost little more than one (2-core AMD EPYC, 49,152 x 576, alone in a loop:
1 row 0.6-1.2 ms, 4 rows 1.0, 8 rows 2.2-3.3, 16 rows 4.4-4.7; a row at a time it was 1.4-2.0,
2.5-2.8, 5.1-7.9 and 9.5-12 ms), and the screen takes it for every call.

Quantization (at load, in C: screen_int8.c spectui_quantize_int8). Row v: q_v = round(W_v / s_v),
s_v = max_i |W_vi| / 127, and Wq_v = s_v q_v. An input row x (fp32) goes in two int8 levels:
p_hi = round(x / t_hi), t_hi = max|x| / 127; r = x - t_hi p_hi (|r| <= t_hi / 2); p_lo = round(r / t),
t = t_hi / 128 (so |p_lo| <= 64, and the C side adds the two levels in int32 before one reduction);
xq = t (128 p_hi + p_lo), and delta = x - xq (at most t / 2 = max|x| / 32,512 an element). The C
product gives g_v = Wq_v . xq, rounded once to float.

The bound. With e_v = W_v - Wq_v (its norm kept from load, summed in float64, rounded up) and
s_v = W_v . x the exact logit,

    s_v - g_v = e_v . x + Wq_v . delta + (g's rounding)
    |s_v - g_v| <= |e_v| |x| + |Wq_v| |delta| + 2^-20 |g_v|          (Cauchy-Schwarz)

For each call rho = max_m |delta_m| / |x_m| (delta in float64), so the bound per unit |x| is
|e_v| + rho |Wq_v|: what argmax_head.py's candidate picker takes (`bound`), next to the 2^-20 |g| it
adds. |e_v| is about 8x the bf16 copy's |W_v - bf16(W_v)|, but the bf16 dot product's x_hi term
(2^-8 |W_v| |x|) is gone, so the total is about twice the bf16 screen's: a few more candidates,
whose fp32 logits decide as before.
"""

from __future__ import annotations

import ctypes as ct

import torch

from . import native

I64, PTR = ct.c_int64, ct.c_void_p
# spectui_screen_int8(M, V, D, w, scale, colsum, x, t, g, threads)
ARGTYPES = [I64, I64, I64, PTR, PTR, PTR, PTR, PTR, PTR, ct.c_int]
# spectui_quantize_int8(V, D, W, codes, scale, colsum, err_norm, q_norm, threads)
QUANTIZE_ARGS = [I64, I64, PTR, PTR, PTR, PTR, PTR, PTR, ct.c_int]


def vnni() -> bool:
    """AVX512-VNNI with AVX512 (F, BW, VL, ...), as torch's cpuinfo reads them."""
    return torch.cpu._is_vnni_supported() and torch.cpu._is_avx512_supported()


def available() -> bool:
    return vnni() and native.function("screen_int8", "spectui_screen_int8", ARGTYPES)[0] is not None


class Int8Screen:
    """g [M, V] and its bound per unit |x| [V] for rows x [M, D] fp32 (the module docstring)."""

    def __init__(self, weight: torch.Tensor) -> None:
        W = weight.detach().float()  # [V, D]
        V, D = W.shape
        if D % 64 or D > 4096:
            raise ValueError(f"the int8 screen reads rows of up to 4,096 in blocks of 64; this layer has {D} columns")
        self.fn = native.function("screen_int8", "spectui_screen_int8", ARGTYPES)[0]
        prepare = native.function("screen_int8", "spectui_quantize_int8", QUANTIZE_ARGS)[0]
        if self.fn is None or prepare is None or not vnni():
            raise RuntimeError("kernels/screen_int8.c needs AVX512-VNNI and a C compiler")
        W = W.contiguous()
        self.codes = torch.zeros(-(-V // 4) * 4 * D, dtype=torch.int8)  # rows in blocks of 4, chunk-interleaved (screen_int8.c)
        self.scale, self.err_norm, self.q_norm = (torch.empty(V, dtype=torch.float32) for _ in range(3))
        self.colsum = torch.empty(V, dtype=torch.int32)
        prepare(V, D, W.data_ptr(), self.codes.data_ptr(), self.scale.data_ptr(), self.colsum.data_ptr(),
                self.err_norm.data_ptr(), self.q_norm.data_ptr(), torch.get_num_threads())
        self.V, self.D = V, D

    def levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """x [M, D] fp32 -> (codes [M, 2, D] uint8: p_hi, p_lo plus 128; t [M]; rho), as the module docstring."""
        M = x.shape[0]
        t_hi = (x.abs().amax(dim=1, keepdim=True) / 127).clamp_min(2.0**-100)  # [M, 1] fp32
        t = t_hi / 128  # exact: the low level's step
        p_hi = torch.round(x / t_hi).clamp_(-127, 127)  # [M, D]
        r = x.double() - t_hi.double() * p_hi  # exact: a float times a code fits float64; |r| <~ t_hi / 2
        p_lo = torch.round(r / t.double()).clamp_(-127, 127)  # [M, D], |p_lo| <~ 64
        delta = r - t.double() * p_lo  # [M, D]: x - t (128 p_hi + p_lo), |delta| <= t / 2
        rho = float((delta.norm(dim=1) / x.double().norm(dim=1).clamp_min(1e-300)).max()) * (1 + 1e-6) + 1e-12
        codes = (torch.stack([p_hi, p_lo.float()], dim=1) + 128).to(torch.uint8).contiguous()  # [M, 2, D]
        return codes, t.reshape(M).contiguous(), rho

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] fp32 -> (g [M, V] fp32, bound [V]): |s_v - g_mv| <= bound_v |x_m| + 2^-20 |g_mv|."""
        codes, t, rho = self.levels(x)
        g = torch.empty(x.shape[0], self.V, dtype=torch.float32)
        self.fn(x.shape[0], self.V, self.D, self.codes.data_ptr(), self.scale.data_ptr(), self.colsum.data_ptr(),
                codes.data_ptr(), t.data_ptr(), g.data_ptr(), torch.get_num_threads())
        return g, torch.add(self.err_norm, self.q_norm, alpha=rho)
