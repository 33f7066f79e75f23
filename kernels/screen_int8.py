"""The output screen's product from an int8 copy of the output layer (kernels/screen_int8.c).

The argmax screen (argmax_head.py) reads its copy of the output layer once a step: 49,152 x 576 for
SmolLM2, 56.6 MB in bf16, about 2.3 ms on two cores of an AMD EPYC, a fifth of a one-token step.
In int8 it is 28.3 MB. With AVX512-VNNI, vpdpbusd multiplies 64 byte pairs an instruction, so the
product stays at the speed of reading the bytes. The C loop takes 4 layer rows by 2 input rows a
pass, so a tree's rows cost little more than one (2-core AMD EPYC, 49,152 x 576, alone in a loop:
1 row 0.6-1.2 ms, 4 rows 1.0, 8 rows 2.2-3.3, 16 rows 4.4-4.7; a row at a time it was 1.4-2.0,
2.5-2.8, 5.1-7.9 and 9.5-12 ms), and the screen takes it for every call. With AVX2 alone
(spectui_screen_int8_avx2: vpmaddwd on int16, the same integer sums, so the same bits) it takes
1.1-1.3 ms a row, 2.0 for 4 rows and 3.3 for 8 (2.5 and 4.6 before its inner loop was written in
asm), against 3.4-4.7, 4.9 and 6.8 for dense_cpu.c's bf16 product it replaced there (2-core AMD
EPYC, Zen 3, no AVX-512). The input
levels are made in C too (spectui_int8_levels), and drafters' output layers read their own int8
copies through `product` alone (kernels/dense_cpu.py Int8Kernel).

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
# spectui_int8_levels(M, D, x, codes, t, rho, threads)
LEVELS_ARGS = [I64, I64, PTR, PTR, PTR, PTR, ct.c_int]


def vnni() -> bool:
    """AVX512-VNNI with AVX512 (F, BW, VL, ...), as torch's cpuinfo reads them."""
    return torch.cpu._is_vnni_supported() and torch.cpu._is_avx512_supported()


def fits(columns: int) -> bool:
    """The C loop reads rows in chunks of 64 columns, and its int32 sums hold for at most 4,096."""
    return columns % 64 == 0 and columns <= 4096


def product_name() -> str:
    """The C product this CPU runs: vpdpbusd with AVX512-VNNI, else vpmaddwd (AVX2; the same bits)."""
    return "spectui_screen_int8" if vnni() else "spectui_screen_int8_avx2"


def available() -> bool:
    return native.function("screen_int8", product_name(), ARGTYPES)[0] is not None


class Int8Screen:
    """g [M, V] and its bound per unit |x| [V] for rows x [M, D] fp32 (the module docstring)."""

    def __init__(self, weight: torch.Tensor) -> None:
        W = weight.detach().float()  # [V, D]
        V, D = W.shape
        if not fits(D):
            raise ValueError(f"the int8 screen reads rows of up to 4,096 in blocks of 64; this layer has {D} columns")
        self.fn = native.function("screen_int8", product_name(), ARGTYPES)[0]
        prepare = native.function("screen_int8", "spectui_quantize_int8", QUANTIZE_ARGS)[0]
        self.make_levels = native.function("screen_int8", "spectui_int8_levels", LEVELS_ARGS)[0]
        if self.fn is None or prepare is None or self.make_levels is None:
            raise RuntimeError("kernels/screen_int8.c needs AVX2 and a C compiler")
        W = W.contiguous()
        self.codes = torch.zeros(-(-V // 4) * 4 * D, dtype=torch.int8)  # rows in blocks of 4, chunk-interleaved (screen_int8.c)
        self.scale, self.err_norm, self.q_norm = (torch.empty(V, dtype=torch.float32) for _ in range(3))
        self.colsum = torch.empty(V, dtype=torch.int32)
        prepare(V, D, W.data_ptr(), self.codes.data_ptr(), self.scale.data_ptr(), self.colsum.data_ptr(),
                self.err_norm.data_ptr(), self.q_norm.data_ptr(), torch.get_num_threads())
        self.V, self.D = V, D

    def levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """x [M, D] fp32 -> (codes [M, 2, D] uint8: p_hi, p_lo plus 128; t [M]; rho), as the module
        docstring (in C: spectui_int8_levels; rho from its per-row |delta| / |x|, rounded up)."""
        x = x.float().contiguous()
        M = x.shape[0]
        codes = torch.empty(M, 2, self.D, dtype=torch.uint8)
        t = torch.empty(M, dtype=torch.float32)
        rho = torch.empty(M, dtype=torch.float64)
        self.make_levels(M, self.D, x.data_ptr(), codes.data_ptr(), t.data_ptr(), rho.data_ptr(), torch.get_num_threads())
        return codes, t, max(rho.tolist()) * (1 + 1e-6) + 1e-12  # the list's max: a third of a torch reduction's cost

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, D] -> g [M, V] fp32 (the screen's product alone: what a drafter's output layer needs)."""
        codes, t, _ = self.levels(x)
        return self._product(codes, t)

    def _product(self, codes: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        g = torch.empty(codes.shape[0], self.V, dtype=torch.float32)
        if self.fn(codes.shape[0], self.V, self.D, self.codes.data_ptr(), self.scale.data_ptr(), self.colsum.data_ptr(),
                codes.data_ptr(), t.data_ptr(), g.data_ptr(), torch.get_num_threads()):
            raise MemoryError("the int8 screen could not allocate its input rows")
        return g

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] fp32 -> (g [M, V] fp32, bound [V]): |s_v - g_mv| <= bound_v |x_m| + 2^-20 |g_mv|."""
        codes, t, rho = self.levels(x)
        return self._product(codes, t), torch.add(self.err_norm, self.q_norm, alpha=rho)
