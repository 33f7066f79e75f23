"""Several bitsandbytes 4-bit projections of one input, as one direct call of its fused CPU kernel.

On CPUs with AVX512-BF16, bitsandbytes 0.50 repacks a Linear4bit's weight at its first forward
into a CPU layout and from then on computes it with one C function that reads the packed 4-bit
weights and the input rounded to bf16 (`gemv_4bit_inference_cpu_{nf4,fp4}_bf16`; despite the
name it takes any number of rows M). Going through the module costs about 28 us of Python,
dispatch, dtype casts and allocation per call around a kernel of 3-8 us at M = 1: on SmolLM2-135M
that is 210 calls and about 6 ms of a 35 ms one-token step.

`Packed4bit` calls the C function itself, once for a group of projections that read the same
input (q, k, v; gate, up). The packed layout groups output rows in blocks of 32, each block
holding its 32 rows' packed weights contiguously, and the scales are stored [K / blocksize, N]:

    weight  [N, K/2] uint8   = cat(weight_q, weight_k, weight_v)      along N (rows)
    absmax  [K/bs, N] bf16   = cat(absmax_q, absmax_k, absmax_v)      along N (columns)

Every output element is computed from its own weight row alone, in the same order whatever M or N
(checked bit for bit by tests/kernels/test_packed_4bit.py), so the fused call returns exactly the
bits the separate modules return:

    y [M, N_q + N_k + N_v] = bf16(x) @ dequant(W)^T      -> fp32, as Linear4bit returns it

The call goes to kernels/packed_4bit.c where it is built: the same arithmetic, lane for lane and
in the same order (so the same bits, checked against bitsandbytes' function), with each decoded
weight serving up to 8 rows where bitsandbytes' serves 4. A tree pass of 5 to 8 rows then costs
little more than one of 4, and a prefill's rows go 8 at a time. Where it is not built (no
compiler, SPECTUI_CPU_KERNELS=0), bitsandbytes' function runs.

`pack_group` returns None where the fast path cannot run (no AVX512-BF16, a layout bitsandbytes did
not repack, a bias): the caller then uses the modules themselves.
"""

from __future__ import annotations

import ctypes as ct
import sys

import torch

from . import native

# spectui_packed_4bit(M, N, K, x, ldx, w, absmax, bs, lut16, y, ldy, threads, mode)
ARGTYPES = [ct.c_int64, ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64, ct.c_void_p, ct.c_void_p, ct.c_int64,
            ct.c_void_p, ct.c_void_p, ct.c_int64, ct.c_int, ct.c_int]
OUT_STORE, OUT_ADD = 0, 1  # y fp32 = the bf16-rounded result; y fp32 += it


def own_kernel():
    """kernels/packed_4bit.c's function where this CPU has AVX512-BF16 and it is built, else None."""
    if not torch.cpu._is_avx512_bf16_supported():
        return None
    return native.function("packed_4bit", "spectui_packed_4bit", ARGTYPES)[0]


def prepare(folder) -> None:
    """Build kernels/packed_4bit.c into `folder` (the model cache's kernels/) rather than at first use."""
    if torch.cpu._is_avx512_bf16_supported():
        native.get("packed_4bit", folder)


class Packed4bit:
    """y = x @ W^T for the stacked 4-bit weights of `modules` (bias-free Linear4bit, packed for CPU)."""

    def __init__(self, modules) -> None:
        from bitsandbytes.cextension import lib

        states = [m.weight.quant_state for m in modules]
        self.weight = torch.cat([m.weight.data for m in modules]).contiguous()  # [N, K/2] uint8
        self.absmax = torch.cat([s.absmax for s in states], dim=1).contiguous()  # [K/bs, N] bf16
        self.sizes = [int(s.shape[0]) for s in states]  # each projection's output features
        self.N, self.K = sum(self.sizes), int(states[0].shape[1])
        self.blocksize = int(states[0].blocksize)
        fp4 = bool(states[0].code[1] > 0)  # bitsandbytes tells the two 4-bit codes apart the same way
        self.kernel = lib.gemv_4bit_inference_cpu_fp4_bf16 if fp4 else lib.gemv_4bit_inference_cpu_nf4_bf16
        self.lut = states[0].code.to(torch.bfloat16).contiguous()  # [16]: the code as the fused kernels read it
        self.own = own_kernel()  # None: bitsandbytes' function
        self.fixed_args = (self.weight.data_ptr(), self.absmax.data_ptr(), self.blocksize, self.lut.data_ptr())

    def __call__(self, x: torch.Tensor, own: bool = True, into: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] (any float dtype) -> [M, N] fp32, bf16-rounded as bitsandbytes' output; own=False:
        through bitsandbytes' function. into: fp32 [M, N] (rows contiguous) that the result is added
        to in place, `into + result` to the bit (our kernel only); returns it."""
        a = x.to(torch.bfloat16).contiguous()  # [M, K]: the kernel reads bf16 rows
        M = a.shape[0]
        if self.own is not None and own:
            out = into if into is not None else torch.empty(M, self.N, dtype=torch.float32)  # [M, N]
            self.own(M, self.N, self.K, a.data_ptr(), a.stride(0), *self.fixed_args, out.data_ptr(), out.stride(0),
                     torch.get_num_threads(), OUT_STORE if into is None else OUT_ADD)
            return out
        if into is not None:
            raise ValueError("Packed4bit(into=...) needs kernels/packed_4bit.c")
        out = torch.empty(M, self.N, dtype=torch.bfloat16)  # [M, N]
        if M:
            self.kernel(ct.c_int64(M), ct.c_int64(self.N), ct.c_int64(self.K), ct.c_void_p(a.data_ptr()),
                        ct.c_void_p(self.weight.data_ptr()), ct.c_void_p(self.absmax.data_ptr()),
                        ct.c_void_p(out.data_ptr()), ct.c_int64(self.blocksize), ct.c_int64(a.stride(0)),
                        ct.c_int64(out.stride(0)))
        return out.float()


def packed_for_cpu(module) -> bool:
    """True once bitsandbytes has repacked this Linear4bit for its fused CPU kernel (at the first
    forward of a module that allows it); makes that first forward happen if it has not."""
    state = getattr(module.weight, "quant_state", None)
    if state is None or module.bias is not None or not getattr(module, "support_avx512bf16_for_cpu", False):
        return False
    if not getattr(state, "packing_format_for_cpu", False):
        try:
            with torch.inference_mode():
                module(torch.zeros(1, module.in_features))  # bitsandbytes repacks here, as in its first real forward
        except (AssertionError, RuntimeError):  # a shape its CPU layout cannot hold (rows not in blocks of 32)
            return False
        state = module.weight.quant_state
    return bool(getattr(state, "packing_format_for_cpu", False)) and state.absmax.dtype == torch.bfloat16


def pack_group(modules) -> Packed4bit | None:
    """One fused call for these Linear4bit modules (same input), or None if any cannot take it."""
    bnb = sys.modules.get("bitsandbytes")  # not imported: no module can be a Linear4bit (and importing it costs ~2 s)
    if bnb is None:
        return None
    if not all(isinstance(m, bnb.nn.Linear4bit) and m.weight.device.type == "cpu" for m in modules):
        return None
    if not all(packed_for_cpu(m) for m in modules):
        return None
    states = [m.weight.quant_state for m in modules]
    if len({(int(s.shape[1]), int(s.blocksize), bool(s.code[1] > 0)) for s in states}) != 1:
        return None
    return Packed4bit(modules)
