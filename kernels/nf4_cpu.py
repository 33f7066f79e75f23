"""bitsandbytes' 4-bit layers on x86 CPUs: one fused kernel instead of dequantise + matmul.

Without AVX512-BF16, bitsandbytes 0.50 computes a Linear4bit on CPU by dequantising the whole
weight to fp32 on every call and then multiplying (about 0.4 ms a projection of SmolLM2-135M at one
row, most of a 110 ms one-token step on a 2-core AVX2 machine). kernels/nf4_cpu.c reads the 4-bit
weights as bitsandbytes stores them and multiplies as it decodes (AVX2 + FMA, OpenMP over output
rows; on CPUs with AVX-512 F/BW/DQ/VL, a path that decodes with one lane permute and gives the same bits:
its products 1.4-1.7x and a verify step 1.3x faster on a Skylake-SP Xeon). Where the CPU has
AVX512-BF16, bitsandbytes has a fused bf16 kernel of its own (kernels/packed_4bit.py); the AVX-512 path
beats it (a verify step 1.2-1.6x faster on an Intel Xeon with AMX, through the C stack), the AVX2 path
does not, so `install` takes such layers only with the AVX-512 path. The weights stay bitsandbytes'
4-bit tensors; nothing is dequantised into memory.

Where the CPU has AMX-BF16, `install` takes kernels/nf4_amx.c instead (`amx_kernel`; SPECTUI_NF4_AMX=0 keeps
nf4_cpu.c): the same call, but on weights repacked once into its tile order (a copy beside bitsandbytes'
tensors, which its own forward keeps for training), with bf16 inputs and code values and fp32 tile sums. Its
bits are not nf4_cpu.c's, but they too do not depend on the row count. Each row a tree pass adds then costs
a fraction of a one-token pass (a verify step of 8 rows 1.3-1.4x, of 16 2.1x faster than nf4_cpu.c's
AVX-512 path on an Intel Xeon with AMX, one row about 4 % slower), and a prompt's prefill about 2.3x faster.

Arithmetic (nf4_cpu.c's header): W[n, k] = code[q] * absmax is bitsandbytes' own dequantised weight
to the bit, and every output y[m, n] = sum_k x[m, k] W[n, k] is summed in one fixed order whatever
the number of rows M and of threads. So a token's row has the same bits in a tree pass as in a
one-token pass, which is what verification needs (the exact attention gives the same for
attention). The order differs from MKL's, so results differ from bitsandbytes' fp32 path in the
last bits: the kernel is *installed* into the verifier (`install`), as the guarded output layer is,
and every user of that model, transformers' own `generate` included, computes with it.

Built at first use with the system C compiler (kernels/native.py); where there is no compiler, no
AVX2/FMA, or a layout it does not handle (a bias, nested statistics, shapes not in blocks), `install`
leaves the layers as they are and says why (`KernelInfo`).
"""

from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import native

ROWS = 4  # output rows per task in nf4_cpu.c
AVX512_VAR = "SPECTUI_NF4_AVX512"  # "0": keep nf4_cpu.c on its AVX2 path where the CPU has AVX-512 (for comparison)
AMX_VAR = "SPECTUI_NF4_AMX"  # "0": keep nf4_cpu.c's fp32 products where the CPU has AMX (for comparison)
# spectui_nf4_matmul(M, N, K, x, ldx, w, absmax, bs, code, y, ldy, threads, add); nf4_amx.c's matmul too
ARGTYPES = [ct.c_int64, ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64, ct.c_void_p, ct.c_void_p, ct.c_int64,
            ct.c_void_p, ct.c_void_p, ct.c_int64, ct.c_int, ct.c_int]
# spectui_nf4_amx_repack(N, K, w, absmax, bs, tiles, scales, threads)
REPACK_ARGTYPES = [ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_void_p, ct.c_int64, ct.c_void_p, ct.c_void_p, ct.c_int]
AMX_ROWS = 16  # output rows a tile: nf4_amx.c needs N % 16 == 0


@dataclass
class KernelInfo:
    installed: int = 0  # layers that compute with the kernel
    reason: str = ""  # why none did, when none did
    avx512: bool = False  # its AVX-512 path runs (set_avx512)
    amx: bool = False  # the layers run nf4_amx.c's bf16 tiles instead (amx_kernel)

    def describe(self) -> str:
        """How the 4-bit layers compute, in words (a loading line, the bench JSON)."""
        if self.installed:
            path = "AMX bf16 tiles" if self.amx else "AVX-512" if self.avx512 else "AVX2"
            return f"spectui 4-bit kernel ({path}, {self.installed} layers)"
        return f"bitsandbytes ({self.reason})"


def layout_problem(module) -> str | None:
    """None if the kernel computes this Linear4bit exactly as described, else what it does not handle."""
    state = getattr(module.weight, "quant_state", None)
    if state is None:
        return "no quantisation state"
    if module.bias is not None:
        return "a bias"
    if state.nested or getattr(state, "packing_format_for_cpu", False):
        return "nested statistics or bitsandbytes' packed CPU layout"
    N, K = int(state.shape[0]), int(state.shape[1])
    bs = int(state.blocksize)
    if N % ROWS or bs % 32 or K % bs:
        return f"shape {N}x{K} with blocks of {bs}"
    if state.absmax.dtype != torch.float32 or module.weight.data.dtype != torch.uint8 or module.weight.device.type != "cpu":
        return "absmax or weights of another type or device"
    return None


class KernelMatmul:
    """y [M, N] = x [M, K] @ W^T through nf4_cpu.c, for one Linear4bit or a stack of several that read
    the same input (q|k|v, gate|up: N = their output features together; every output element has
    the bits it has alone). A stack keeps the weights once: each module's 4-bit data and scales
    become views of the stacked tensors."""

    def __init__(self, fn, modules, repack=None) -> None:
        # fn: nf4_cpu.c's spectui_nf4_matmul, or nf4_amx.c's matmul with its `repack` (it reads tiles)
        self.fn, self.modules, self.repack = fn, list(modules), repack
        states = [m.weight.quant_state for m in self.modules]
        self.N, self.K, self.bs = sum(int(s.shape[0]) for s in states), int(states[0].shape[1]), int(states[0].blocksize)
        self.code = states[0].code.to(torch.float32).contiguous()  # [16]
        self.stack = None
        if len(self.modules) > 1:
            weight = torch.cat([m.weight.data.reshape(-1) for m in self.modules])  # [N * K / 2] uint8
            absmax = torch.cat([s.absmax.reshape(-1) for s in states])  # [N * K / bs] fp32
            at, scale_at = 0, 0
            for m, s in zip(self.modules, states):
                size, scales = m.weight.data.numel(), s.absmax.numel()
                m.weight.data = weight[at : at + size].view(m.weight.data.shape)
                s.absmax = absmax[scale_at : scale_at + scales].view(s.absmax.shape)
                at, scale_at = at + size, scale_at + scales
            self.stack = (weight, absmax)
            self.bind()
            row = 0
            for m in self.modules:  # their own kernels read the stacked tensors from now on
                if uses_kernel(m):
                    m.spectui_kernel.bind(self, row)
                row += m.spectui_kernel.N if uses_kernel(m) else int(m.weight.quant_state.shape[0])
            return
        self.bind()

    def bind(self, stack: KernelMatmul | None = None, row: int = 0) -> None:
        """Read the weights' tensors and addresses now: a call reads them from here (a stack made
        later re-points a module's tensors, and rebinds its kernel, with `stack` and its first `row` there).
        With `repack`, the tensors are nf4_amx.c's tiles: made here, or views of the stack's (its rows
        row .. row + N: rows of 16 are contiguous in both the tiles and the scales)."""
        if self.stack is not None:
            weight, absmax = self.stack
        else:
            weight, absmax = self.modules[0].weight.data, self.modules[0].weight.quant_state.absmax
        if self.repack is not None and stack is not None and stack.repack is not None:
            tiles, scales = stack.tensors
            at, scale_at = row * self.K // 2, row * (self.K // self.bs)
            weight, absmax = tiles[at : at + self.N * self.K // 2], scales[scale_at : scale_at + self.N * (self.K // self.bs)]
        elif self.repack is not None:
            tiles, scales = torch.empty(weight.numel(), dtype=torch.uint8), torch.empty(absmax.numel(), dtype=torch.float32)
            self.repack(self.N, self.K, weight.data_ptr(), absmax.data_ptr(), self.bs, tiles.data_ptr(),
                        scales.data_ptr(), torch.get_num_threads())
            weight, absmax = tiles, scales
        self.tensors = (weight, absmax)  # kept alive while the addresses are used
        self.pointers = (weight.data_ptr(), absmax.data_ptr(), self.bs, self.code.data_ptr())

    def __call__(self, x: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """into: fp32 [M, N] contiguous rows to add the product to in place (h + x W^T, one rounding per
        element after the product's own, as torch's `h + linear(x)`), returned."""
        if into is not None and not (into.dtype == torch.float32 and into.is_contiguous()):
            return into.add_(self(x).view(into.shape))
        plain = x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous()  # the glue's rows: as they are
        a = x if plain else x.reshape(-1, self.K).to(torch.float32).contiguous()  # [M, K]
        M = a.shape[0]
        out = torch.empty(M, self.N, dtype=torch.float32) if into is None else into  # [M, N]
        if M and self.fn(M, self.N, self.K, a.data_ptr(), self.K, *self.pointers, out.data_ptr(), self.N,
                         torch.get_num_threads(), into is not None):
            raise MemoryError("the 4-bit kernel could not allocate its rows")
        return out if plain or into is not None else out.view(*x.shape[:-1], self.N)


def kernel_group(modules) -> KernelMatmul | None:
    """One kernel call for these modules (same input), or None unless the kernel runs each of them. One module:
    its own kernel (a second KernelMatmul would hold a second copy of nf4_amx.c's tiles)."""
    if not modules or not all(uses_kernel(m) for m in modules):
        return None
    if len(modules) == 1:
        return modules[0].spectui_kernel
    states = [m.weight.quant_state for m in modules]
    if len({(int(s.shape[1]), int(s.blocksize), tuple(s.code.tolist())) for s in states}) != 1:
        return None
    return KernelMatmul(modules[0].spectui_kernel.fn, modules, modules[0].spectui_kernel.repack)


def kernel_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Linear4bit.forward through the kernel (no grad: inference only; the rest as bitsandbytes does)."""
    if x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):
        return self.spectui_plain_forward(x)
    return self.spectui_kernel(x).to(x.dtype)


def install(model, folder: Path | None = None) -> KernelInfo:
    """Compute every Linear4bit of `model` with the kernel (all or none); KernelInfo says how many, or why not."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        return KernelInfo(reason="bitsandbytes is not installed")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    if not layers:
        return KernelInfo(reason="no 4-bit layers")
    for m in layers:
        if (problem := layout_problem(m)) is not None:
            return KernelInfo(reason=f"a 4-bit layer has {problem}")
    fn, why = native.function("nf4_cpu", "spectui_nf4_matmul", ARGTYPES, folder)  # disabled, no AVX2, no compiler: why
    if fn is None:
        return KernelInfo(reason=why)
    wide = set_avx512(avx512_wanted())
    tiles, repack = amx_kernel(folder) if all(int(m.weight.quant_state.shape[0]) % AMX_ROWS == 0 for m in layers) else (None, None)
    fused = [m for m in layers if getattr(m, "support_avx512bf16_for_cpu", False)]
    # bitsandbytes' fused bf16 kernel would run these (AVX512-BF16 CPUs). On an Intel Xeon with AMX a verify step
    # through nf4_cpu.c's AVX-512 path and the C stack took 0.63-0.85x the time of one through that kernel
    # (kernels/packed_4bit.c), and through its AVX2 path 0.78-1.39x: take them only with AVX-512 (or AMX tiles).
    if fused and tiles is None and not wide:
        return KernelInfo(reason="bitsandbytes' own fused AVX512-BF16 kernel runs these layers")
    for m in fused:
        m.support_avx512bf16_for_cpu = False  # its own forward (kept below) dequantises; no repacking
    fn = tiles or fn
    for m in layers:
        m.spectui_kernel = KernelMatmul(fn, [m], repack)
        m.spectui_plain_forward = m.forward  # bitsandbytes' own, for what the kernel does not serve
        m.forward = kernel_forward.__get__(m)  # this instance only: Linear4bit itself is untouched
    return KernelInfo(installed=len(layers), avx512=wide, amx=tiles is not None)


def amx_wanted() -> bool:
    """Whether the environment lets `install` take nf4_amx.c where the CPU has AMX (SPECTUI_NF4_AMX, on unless "0")."""
    return os.environ.get(AMX_VAR, "1").strip() != "0"


def amx_kernel(folder: Path | None = None):
    """(nf4_amx.c's matmul, its repack) where the CPU has AMX-BF16, Linux lends this process its tiles and the
    environment allows it, else (None, None)."""
    if not amx_wanted():
        return None, None
    lib, _ = native.get("nf4_amx", folder)
    if lib is None:
        return None, None
    ready = lib.spectui_nf4_amx_ready
    ready.argtypes, ready.restype = [], ct.c_int
    if not ready():
        return None, None
    fn, repack = lib.spectui_nf4_amx_matmul, lib.spectui_nf4_amx_repack
    fn.argtypes, fn.restype = ARGTYPES, ct.c_int
    repack.argtypes, repack.restype = REPACK_ARGTYPES, ct.c_int
    return fn, repack


def avx512_wanted() -> bool:
    """Whether the environment lets nf4_cpu.c take its AVX-512 path (SPECTUI_NF4_AVX512, on unless "0")."""
    return os.environ.get(AVX512_VAR, "1").strip() != "0"


def set_avx512(on: bool) -> bool:
    """Let nf4_cpu.c take its AVX-512 path (the same bits as its AVX2 one) where the CPU has AVX-512 F, BW,
    DQ and VL, or keep it on AVX2 -> whether the AVX-512 path now runs, for every caller in this process."""
    lib, _ = native.get("nf4_cpu")
    if lib is None:
        return False
    fn = lib.spectui_nf4_set_avx512
    fn.argtypes, fn.restype = [ct.c_int], ct.c_int
    return bool(fn(int(on)))


def uses_kernel(module) -> bool:
    return isinstance(getattr(module, "spectui_kernel", None), KernelMatmul)
