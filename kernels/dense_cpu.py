"""A drafter's dense layers on AVX2 CPUs without AVX512-BF16: bf16 weights, one C call a product.

Drafters (an SSM, a feature head) run one to four rows a forward. On these CPUs MKL's products
for so few rows against a [N, K] weight run far below memory speed: a 8,192 x 576 fp32 layer
takes 1.5 ms for one row and 3.6 ms for two, where reading it takes 0.6 ms. kernels/dense_cpu.c
reads the weight as bf16 (half the bytes; widening bf16 to fp32 is exact) and lets each weight
vector serve up to four input rows, so one to four rows cost about what reading the weight costs.

Where bf16 compute is fast (CUDA, AVX512-BF16 CPUs) drafters already run in bf16 through torch
(engine/loading.py drafter_dtype) and this kernel is not used. A drafter's weights round to bf16
here (an SSM saved in bf16, as the shipped ones are, loses nothing); drafting needs speed, not the
verifier's rounding. The verifier's own logits never come from it: its one other user is the
output layer's argmax screen (kernels/argmax_head.py), which only shortlists candidates under a
proven rounding bound and takes every decided logit from the fp32 head.
"""

from __future__ import annotations

import ctypes as ct
from pathlib import Path

import torch

from . import native

# spectui_dense_bf16(M, N, K, x, ldx, w, bias, y, ldy, threads)
ARGTYPES = [ct.c_int64, ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64, ct.c_void_p, ct.c_void_p, ct.c_void_p,
            ct.c_int64, ct.c_int]


class DenseKernel:
    """x [..., K] -> x @ W^T + b [..., N] in fp32, W kept in bf16 ([N, K]); a drop-in for F.linear at inference."""

    def __init__(self, fn, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.fn = fn
        self.weight = weight.detach().to(torch.bfloat16).contiguous()  # [N, K]
        self.bias = None if bias is None else bias.detach().to(torch.float32).contiguous()  # [N]
        self.N, self.K = self.weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, self.K).to(torch.float32).contiguous()  # [M, K]
        out = torch.empty(a.shape[0], self.N, dtype=torch.float32)  # [M, N]
        self.fn(a.shape[0], self.N, self.K, a.data_ptr(), self.K, self.weight.data_ptr(),
                None if self.bias is None else self.bias.data_ptr(), out.data_ptr(), self.N, torch.get_num_threads())
        return out.view(*x.shape[:-1], self.N)


def wanted() -> bool:
    """True where drafters compute in fp32 through torch (no AVX512-BF16): the CPUs this kernel is for."""
    return not torch.cpu._is_avx512_bf16_supported()


def available() -> bool:
    """The kernel serves this CPU: wanted here, switched on and built."""
    return wanted() and native.get("dense_cpu")[0] is not None  # asked every greedy step: no function set-up


def prepare(folder: Path | None) -> None:
    """Build the kernel into `folder` (the model cache's kernels/) where it is wanted, rather than at first use."""
    if wanted():
        native.get("dense_cpu", folder)


def dense(weight: torch.Tensor, bias: torch.Tensor | None = None, folder: Path | None = None) -> DenseKernel | None:
    """A DenseKernel for this CPU weight [N, K], or None where the kernel is not for it (not wanted on
    this CPU, switched off, not built, K not a multiple of 8, not on the CPU)."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] % 8 or not wanted():
        return None
    fn, _ = native.function("dense_cpu", "spectui_dense_bf16", ARGTYPES, folder)
    return None if fn is None else DenseKernel(fn, weight, bias)
