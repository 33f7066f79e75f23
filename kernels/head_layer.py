"""kernels/head_layer.c from Python: the feature head's decoder layer for a drafting level, in one call.

engine/feature_head.py's torch forward spends most of a drafting level's time dispatching some 25
small ops (1.2 ms for two rows, of which the products are 0.3). `head_layer()` gives a HeadLayer
where both libraries build: its products are dense_cpu.c's int8-weight product (`int8_layer`: one
scale a row) with the rows widened to fp32, on every AVX2 CPU (the drafter's cache bf16 where the
drafter is, on AVX512-BF16 CPUs, fp32 elsewhere); else None and the head keeps torch's ops. It
computes in fp32 between products whose inputs are rounded to bf16, the torch path in bf16: drafts,
not the verifier's tokens, so the two need only agree closely (tests/kernels/test_head_layer.py bounds
the difference and checks the cache writes).

Why int8: a drafting step's layer reads its 4.2 M weights from memory (the verifier's pass in between
evicts them), and reading is the cost. Against bf16 weights, half the bytes took a call from 642 to
548 us in drafting steps on the Vicuna questions (2-core AVX2 EPYC, both in one process; the head's
top-1 agreement with the verifier moved by 0.1 point, less than its noise: docs/performance.md, stop
55), and on a Xeon with AVX512-BF16 and AMX, where dense_cpu.c's vdpbf16ps dot read bf16, a drafting
level from 1.24 to 0.98 ms (median, expand calls; the first level with its catch-up 1.18 -> 0.97 ms;
/work/exp/k66/head_ab.py, alternating per prompt; docs/performance.md, stop 66).
"""

from __future__ import annotations

import ctypes as ct
from pathlib import Path

import torch

from . import dense_cpu, native

I64, PTR = ct.c_int64, ct.c_void_p
# spectui_head_layer(T, H, Hq, Hkv, D, I, P, tokens, embed, prev, positions, inv_freq, fc_w, fc_b, norm_in,
#                    qkv_w, o_w, norm_post, gu_w, down_w, eps, kcache, vcache, cap, used, mask, out, dot, threads,
#                    kv_fp32)
ARGTYPES = [I64] * 7 + [PTR] * 13 + [ct.c_float, PTR, PTR, I64, I64, PTR, PTR, PTR, ct.c_int, ct.c_int]
MAX_ROWS = 8  # rows a call takes at most (max_rows) where torch's products are MKL's fp32 ones
MAX_ROWS_BF16 = 128  # ... and where the drafter is bf16: a fresh cache's whole catch-up (engine/feature_drafter.py feeds 128)


def max_rows(dtype: torch.dtype) -> int:
    """Rows one call of the layer takes at most for a drafter in `dtype`; more go to torch's forward.
    fp32 (AVX2 CPUs): a drafting level or a steady catch-up, MAX_ROWS; MKL's products batch a prompt's
    catch-up better. bf16 (AVX512-BF16 CPUs): MAX_ROWS_BF16, a fresh cache's whole catch-up: oneDNN builds
    its bf16 products anew for each row count it has not seen, and the first catch-up of a prompt (39-67
    rows) took 3.5-30 ms through torch (3.5 only for a length seen before) against 4.5-7.3 ms here
    (Vicuna questions, Xeon with AMX, /work/exp/k66/first_begin.py; docs/performance.md, stop 66)."""
    return MAX_ROWS_BF16 if dtype == torch.bfloat16 else MAX_ROWS
MAX_HEAD_DIM = 256


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.bfloat16).contiguous()


def f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


def int8_layer(w: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> the block dense_cpu.c's spectui_dense_int8_x16 reads (uint8 [4 N + N K]): the row scales
    s = max_k |W[n, k]| / 127 (fp32), then q = round(W / s) [N, K] int8, so that W[n, k] ~ s[n] q[n, k]."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)  # [N]
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [N, K]
    return torch.cat([scale.contiguous().view(torch.uint8), q.reshape(-1).view(torch.uint8)])


class HeadLayer:
    """(tokens, prev features, positions, the drafter's cache, used slots, mask) -> the layer's output
    rows, bf16 [T, H]; the rows' keys and values are written into the cache at slots used .. used + T - 1."""

    def __init__(self, fn, dot_address: int, weights: dict, embed: torch.Tensor, heads: int, kv_heads: int,
                 head_dim: int, rope_theta: float, eps: float) -> None:
        self.fn, self.dot = fn, dot_address
        self.w = {name: (int8_layer(w) if name.endswith("_w") else f32(w)) for name, w in weights.items()}  # PRODUCT's format
        self.embed = bf16(embed)  # [V, H]
        self.H = self.embed.shape[1]
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.I = weights["down_w"].shape[1]
        self.P = weights["fc_w"].shape[1] - self.H  # the width of prev: H, or 2H for a prev_token head
        self.inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [D/2]
        self.eps = eps
        w = self.w  # the weights' addresses, in the call's order (they live as long as self)
        self.weight_ptrs = (self.embed.data_ptr(), w["fc_w"].data_ptr(), w["fc_b"].data_ptr(), w["norm_in"].data_ptr(),
                            w["qkv_w"].data_ptr(), w["o_w"].data_ptr(), w["norm_post"].data_ptr(), w["gu_w"].data_ptr(),
                            w["down_w"].data_ptr())

    def __call__(self, tokens: list[int], prev: torch.Tensor, positions: list[int], kv: torch.Tensor, used: int,
                 mask: torch.Tensor | None) -> torch.Tensor:
        """prev [T, P] (FeatureHead.prev_inputs: f_{t-1}, then e(x_{t-1}) for a prev_token head); kv [2, Hkv,
        cap, D] bf16 or fp32, contiguous; mask [T, used + T] (nonzero: may see) or None (causal) -> [T, H] bf16."""
        if kv.dtype not in (torch.bfloat16, torch.float32) or not kv.is_contiguous():
            raise ValueError(f"the drafter's cache must be contiguous bf16 or fp32, not {kv.dtype}")
        T = len(tokens)
        tok, pos = (I64 * T)(*tokens), (I64 * T)(*positions)  # a ctypes array is a tenth of torch.tensor's cost
        prev = prev.to(torch.bfloat16).contiguous()
        m = None if mask is None else mask.to(torch.uint8).contiguous()
        out = torch.empty(T, self.H, dtype=torch.bfloat16)
        if prev.shape != (T, self.P):
            raise ValueError(f"prev rows {tuple(prev.shape)} do not fit the layer's input width {self.H + self.P}")
        embed, fc_w, fc_b, norm_in, qkv_w, o_w, norm_post, gu_w, down_w = self.weight_ptrs
        status = self.fn(T, self.H, self.heads, self.kv_heads, self.head_dim, self.I, self.P, ct.addressof(tok), embed,
                         prev.data_ptr(), ct.addressof(pos), self.inv_freq.data_ptr(), fc_w, fc_b, norm_in, qkv_w, o_w,
                         norm_post, gu_w, down_w, self.eps, kv[0].data_ptr(), kv[1].data_ptr(), kv.shape[2], used,
                         None if m is None else m.data_ptr(), out.data_ptr(), self.dot, torch.get_num_threads(),
                         int(kv.dtype == torch.float32))
        if status:
            raise MemoryError("head_layer.c could not allocate its scratch")
        return out


def prepare(folder: Path | None) -> None:
    """Build the library into `folder` (the model cache's kernels/) where it serves, rather than at first use."""
    native.get("head_layer", folder)  # (None, why) where it cannot build: no AVX2, no compiler


PRODUCT = "spectui_dense_int8_x16"  # dense_cpu.c's product the layer calls: int8 weights, read with AVX2


def head_layer(weights: dict, embed: torch.Tensor, heads: int, kv_heads: int, head_dim: int, rope_theta: float,
               eps: float, folder: Path | None = None) -> HeadLayer | None:
    """A HeadLayer for these weights (fc_w, fc_b, norm_in, qkv_w, o_w, norm_post, gu_w, down_w) where the
    libraries build (x86 with AVX2), else None."""
    if head_dim % 16 or head_dim > MAX_HEAD_DIM or heads % kv_heads or embed.device.type != "cpu":
        return None
    dot, _ = native.function("dense_cpu", PRODUCT, dense_cpu.ARGTYPES, folder)
    fn, _ = native.function("head_layer", "spectui_head_layer", ARGTYPES, folder)
    if dot is None or fn is None:
        return None
    return HeadLayer(fn, ct.cast(dot, ct.c_void_p).value, weights, embed, heads, kv_heads, head_dim, rope_theta, eps)
