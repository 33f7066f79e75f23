"""kernels/stack_cpu.c from Python: all of a verifier's decoder layers in one call.

`stack_for(lean)` gives a Stack where LeanModel runs its glue path in fp32 (every 4-bit layer on
kernels/nf4_cpu.c, the exact attention's C kernels, glue_cpu.c's fp32 norms and silu with their
checks passed), else None. A Stack holds the layers' weights' addresses (bound once: a KernelMatmul
binds its own at construction, and LeanModel builds its projections before this) and the functions'
addresses, and runs one sequence's T rows through every layer with one ctypes call instead of about
ten a layer. stack_cpu.c calls the same functions with the same arguments in the same order as
LeanModel's loop, so the bits are the loop's.
"""

from __future__ import annotations

import ctypes as ct

import torch

from . import native
from .exact_attention import PreparedMask, tokens_per_task
from .glue_cpu import SUM_ROWS
from .nf4_cpu import KernelMatmul

I64, PTR = ct.c_int64, ct.c_void_p


class Ops(ct.Structure):
    _fields_ = [("matmul", PTR), ("rms", PTR), ("rope", PTR), ("silu", PTR), ("exp8", PTR), ("rows", PTR),
                ("grouped", PTR)]


class Proj(ct.Structure):
    _fields_ = [("N", I64), ("K", I64), ("bs", I64), ("w", PTR), ("absmax", PTR), ("code", PTR)]


class Layer(ct.Structure):
    _fields_ = [("norm_in", PTR), ("norm_post", PTR), ("eps_in", ct.c_float), ("eps_post", ct.c_float),
                ("scale", ct.c_double), ("qkv", Proj), ("o", Proj), ("gate_up", Proj), ("down", Proj)]


class Call(ct.Structure):
    _fields_ = [("T", I64), ("H", I64), ("Hq", I64), ("Hkv", I64), ("D", I64), ("I", I64), ("start", I64),
                ("kv", PTR), ("capacity", I64), ("cos", PTR), ("sin", PTR), ("mask", PTR), ("threads", ct.c_int),
                ("block", I64)]


def address(fn) -> int:
    return ct.cast(fn, ct.c_void_p).value


def project(kernel: KernelMatmul) -> Proj:
    w, absmax, bs, code = kernel.pointers
    return Proj(kernel.N, kernel.K, bs, w, absmax, code)


class Stack:
    """Every decoder layer of a LeanModel for one sequence of T <= SUM_ROWS rows, in one call."""

    def __init__(self, fn, lean, glue_addresses: tuple[int, int, int, int]) -> None:
        found = lean.attention_kernels
        self.fn = fn
        self.ops = Ops(address(lean.layers[0].qkv.packed.fn), *glue_addresses, address(found.rows),
                       address(found.grouped))
        self.layers = (Layer * len(lean.layers))(*[
            Layer(layer.norm_in[0].data_ptr(), layer.norm_post[0].data_ptr(), layer.norm_in[1], layer.norm_post[1],
                  layer.scaling, project(layer.qkv.packed), project(layer.o.packed), project(layer.gate_up.packed),
                  project(layer.down.packed))
            for layer in lean.layers])
        self.norms = [(layer.norm_in[0], layer.norm_post[0]) for layer in lean.layers]  # alive while addressed
        self.H, self.I = lean.layers[0].o.packed.N, lean.layers[0].down.packed.K
        self.Hq, self.Hkv, self.D = lean.heads, lean.kv_heads, lean.head_dim

    def applies(self, T: int, S: int, mask) -> bool:
        """The loop's C path for T rows after S - T cached ones: at most SUM_ROWS (the norms' own sums of
        squares), and a causal pass or one mask [1, T, S] for every head."""
        return 0 < T <= SUM_ROWS and (mask is None or (isinstance(mask, PreparedMask) and mask.allowed is not None
                                                       and tuple(mask.allowed.shape) == (1, T, S)))

    def __call__(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor, start: int,
                 mask: PreparedMask | None) -> None:
        """rows [T, H] fp32 contiguous, updated in place; cos, sin [T, D] fp32 contiguous; kv the cache
        [L, 2, 1, Hkv, capacity, D] float32 contiguous; mask None (causal) or one with `allowed` [1, T, S]."""
        T = rows.shape[0]
        threads = torch.get_num_threads()
        allowed = None if mask is None else mask.allowed.contiguous()  # [1, T, S] uint8
        call = Call(T, self.H, self.Hq, self.Hkv, self.D, self.I, start, kv.data_ptr(), kv.shape[4], cos.data_ptr(),
                    sin.data_ptr(), None if allowed is None else allowed.data_ptr(), threads,
                    tokens_per_task(1, self.Hq, self.Hkv, T, threads) or 0)
        failed = self.fn(len(self.layers), self.layers, ct.byref(self.ops), ct.byref(call), rows.data_ptr())
        if failed:
            raise MemoryError("the decoder stack's kernels could not allocate their scratch")


def stack_for(lean) -> Stack | None:
    """A Stack for this LeanModel, or None where its layers do not all take the fp32 C path."""
    if lean.glue is None or not lean.glue_fp32 or lean.attention_kernels is None or not lean.layers:
        return None
    projections = [p.packed for layer in lean.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    if not all(isinstance(p, KernelMatmul) for p in projections) or len({address(p.fn) for p in projections}) != 1:
        return None
    H, I, D = projections[1].N, projections[3].K, lean.head_dim
    if I % 8 or D % 4 or D > 256 or lean.heads % lean.kv_heads:
        return None
    glue_addresses = lean.glue.fp32_addresses(H)  # None where the C glue would not give torch's bits
    fn, _ = native.function("stack_cpu", "spectui_stack_forward", [I64, PTR, PTR, PTR, PTR])
    return None if fn is None or glue_addresses is None else Stack(fn, lean, glue_addresses)
