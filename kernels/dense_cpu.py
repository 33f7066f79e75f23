"""A drafter's dense layers on CPU (and the output screen's product): bf16 weights, one C call a product.

Drafters (an SSM, a feature head) run one to four rows a forward. On these CPUs MKL's products
for so few rows against a [N, K] weight run far below memory speed: a 8,192 x 576 fp32 layer
takes 1.5 ms for one row and 3.6 ms for two, where reading it takes 0.6 ms. kernels/dense_cpu.c
reads the weight as bf16 (half the bytes; widening bf16 to fp32 is exact) and lets each weight
vector serve up to four input rows, so one to four rows cost about what reading the weight costs.

On AVX512-BF16 CPUs drafters run in bf16 (engine/loading.py drafter_dtype), and torch's bf16
products go through oneDNN's AMX tiles: 16 rows cost what one does, but one row of a 49,152 x 576
layer takes 2.1-2.4 ms where streaming its bf16 weights takes 1, and a 8,192-row one 0.38 ms against
0.25. There `bf16_dot` gives a DotKernel: up to DOT_MAX_ROWS rows through dense_cpu.c's vdpbf16ps
loop (x rounded to bf16, exact products, fp32 sums), more rows through torch's W @ x^T (its faster
side). The feature head's catch-up of one token: 1.6 -> 0.8 ms; its level of two nodes 2.4 -> 1.45.

A drafter's weights round to bf16 here (an SSM saved in bf16, as the shipped ones are, loses
nothing); drafting needs speed, not the verifier's rounding. The verifier's own logits never come
from it: its one other user is the output layer's argmax screen (kernels/argmax_head.py: DenseKernel
on AVX2, DotKernel.loop on AVX512-BF16 for a few columns), which only shortlists candidates under a
proven rounding bound and takes every decided logit from the fp32 head.

A drafting level then wants each row's few likeliest tokens and their probabilities: `softmax_top`
(dense_cpu.c spectui_softmax_top) gives them in one call where torch takes a softmax, a top-k and
their dispatch (with the head run every step, its drafting fell from 2.34 to 2.18 ms a run on a
2-core AVX2 EPYC with this and two Python cuts in FeatureDrafter.catch_up; docs/performance.md).
"""

from __future__ import annotations

import ctypes as ct
from pathlib import Path

import torch

from . import native, screen_int8

# spectui_dense_bf16(M, N, K, x, ldx, w, bias, y, ldy, threads)
ARGTYPES = [ct.c_int64, ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64, ct.c_void_p, ct.c_void_p, ct.c_void_p,
            ct.c_int64, ct.c_int]
# spectui_dot_bf16 takes the same arguments (x bf16); up to this many rows, then torch's product
DOT_MAX_ROWS = 3
# spectui_softmax_top(M, V, g, k, idx, prob): a drafter's top-k tokens and their probabilities
TOP_ARGS = [ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64, ct.c_void_p, ct.c_void_p]
TOP_MAX = 16  # the C function's largest k


class DenseKernel:
    """x [..., K] -> x @ W^T + b [..., N] in fp32, W kept in bf16 ([N, K]); a drop-in for F.linear at inference."""

    x_dtype = torch.float32  # what the C function reads x as

    def __init__(self, fn, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.fn = fn
        self.weight = weight.detach().to(torch.bfloat16).contiguous()  # [N, K]
        self.bias = None if bias is None else bias.detach().to(torch.float32).contiguous()  # [N]
        self.N, self.K = self.weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x.reshape(-1, self.K).to(self.x_dtype).contiguous()).view(*x.shape[:-1], self.N)

    def product(self, a: torch.Tensor) -> torch.Tensor:
        """a [M, K] contiguous, x_dtype -> [M, N] fp32 through the C function."""
        out = torch.empty(a.shape[0], self.N, dtype=torch.float32)  # [M, N]
        self.fn(a.shape[0], self.N, self.K, a.data_ptr(), self.K, self.weight.data_ptr(),
                None if self.bias is None else self.bias.data_ptr(), out.data_ptr(), self.N, torch.get_num_threads())
        return out


class DotKernel(DenseKernel):
    """x [..., K] -> x @ W^T + b [..., N] fp32 with x rounded to bf16, W kept in bf16 ([N, K]) (AVX512-BF16)."""

    x_dtype = torch.bfloat16

    def product(self, a: torch.Tensor) -> torch.Tensor:
        if a.shape[0] <= DOT_MAX_ROWS:
            return self.loop(a)
        out = (self.weight @ a.T).T.float()  # [M, N]: oneDNN (AMX), as cheap for 16 rows as for one; W @ x^T its faster side
        return (out if self.bias is None else out + self.bias).contiguous()

    def loop(self, a: torch.Tensor) -> torch.Tensor:
        """a [M, K] bf16 contiguous -> [M, N] fp32 through the C loop whatever M (the caller chose it)."""
        return super().product(a)


def bf16_dot(weight: torch.Tensor, bias: torch.Tensor | None = None, folder: Path | None = None) -> DotKernel | None:
    """A DotKernel for this CPU weight [N, K] where the CPU has AVX512-BF16 and the kernel is built
    (and not switched off), else None."""
    if weight.device.type != "cpu" or weight.dim() != 2 or not torch.cpu._is_avx512_bf16_supported():
        return None
    fn, _ = native.function("dense_cpu", "spectui_dot_bf16", ARGTYPES, folder)
    return None if fn is None else DotKernel(fn, weight, bias)


INT8_MIN_ROWS = 4096  # a drafter's output layer (8,192 or 49,152 rows here) reads an int8 copy where it can


class Int8Kernel:
    """x [..., K] -> about x @ W^T [..., N] fp32 from screen_int8.c's int8 copy of W (AVX512-VNNI or AVX2):
    half the bytes of bf16, and the rows of a drafting level share each weight load. Drafts need
    no exact logits (the verifier decides); the error stays within the screen's bound (screen_int8.py:
    mostly the weights' int8 rounding, |W_v - Wq_v| |x|)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.screen = screen_int8.Int8Screen(weight)
        self.N, self.K = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.screen.product(x.reshape(-1, self.K)).view(*x.shape[:-1], self.N)


def softmax_top_function():
    """dense_cpu.c's spectui_softmax_top where it builds, else None (softmax_top then takes torch's ops)."""
    return native.function("dense_cpu", "spectui_softmax_top", TOP_ARGS)[0]


def softmax_top(logits: torch.Tensor, k: int, fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [M, V] -> (columns [M, k] int64, largest first; their probabilities under softmax(logits)
    [M, k] fp32): torch.topk(torch.softmax(logits, -1), k), in one call of dense_cpu.c's spectui_softmax_top
    where `fn` is it (softmax_top_function(); fp32 contiguous CPU logits, V % 8 == 0, k <= TOP_MAX), else
    through those torch ops."""
    M, V = logits.shape
    if (fn is None or k > TOP_MAX or k > V or V % 8 or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or not logits.is_contiguous()):
        top = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
        return top.indices, top.values
    idx = torch.empty(M, k, dtype=torch.int64)
    prob = torch.empty(M, k, dtype=torch.float32)
    fn(M, V, logits.data_ptr(), k, idx.data_ptr(), prob.data_ptr())
    return idx, prob


def drafter_kernel(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """This file's product for a drafter's weight [N, K] where it serves this CPU and dtype: an output
    layer without bias (N >= INT8_MIN_ROWS, K as screen_int8.fits) in int8 (screen_int8.c); else fp32 weights
    on AVX2 without AVX512-BF16 (dense), bf16 weights on AVX512-BF16 (bf16_dot); else None."""
    if (bias is None and weight.dim() == 2 and weight.shape[0] >= INT8_MIN_ROWS and screen_int8.fits(weight.shape[1])
            and weight.device.type == "cpu" and screen_int8.available()):
        return Int8Kernel(weight)
    make = {torch.float32: dense, torch.bfloat16: bf16_dot}.get(weight.dtype)
    return None if make is None else make(weight, bias)


def dot_available() -> bool:
    """bf16_dot serves this CPU: AVX512-BF16, switched on and built (for tests: bf16_dot says it per weight)."""
    return torch.cpu._is_avx512_bf16_supported() and native.get("dense_cpu")[0] is not None


def wanted() -> bool:
    """True where drafters compute in fp32 through torch (no AVX512-BF16): the CPUs this kernel is for."""
    return not torch.cpu._is_avx512_bf16_supported()


def available() -> bool:
    """The kernel serves this CPU: wanted here, switched on and built."""
    return wanted() and native.get("dense_cpu")[0] is not None  # asked every greedy step: no function set-up


def prepare(folder: Path | None) -> None:
    """Build the kernel into `folder` (the model cache's kernels/) where it is wanted, rather than at first use."""
    if wanted() or torch.cpu._is_avx512_bf16_supported():
        native.get("dense_cpu", folder)


def dense(weight: torch.Tensor, bias: torch.Tensor | None = None, folder: Path | None = None) -> DenseKernel | None:
    """A DenseKernel for this CPU weight [N, K], or None where the kernel is not for it (not wanted on
    this CPU, switched off, not built, K not a multiple of 8, not on the CPU)."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] % 8 or not wanted():
        return None
    fn, _ = native.function("dense_cpu", "spectui_dense_bf16", ARGTYPES, folder)
    return None if fn is None else DenseKernel(fn, weight, bias)
