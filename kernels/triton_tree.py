"""Triton tree-attention kernel (SpecInfer-style verification) and its Python launcher.

One launch scores all T tree nodes of a speculation step against the KV cache:

    q: [B, Hq, T, D]     queries of the tree nodes
    k, v: [B, Hkv, P + T, D]   committed prefix (P = prefix_len) followed by the tree nodes
    tree bits: int32 [B, T, W]  node i's ancestor mask row, bit j of word w = node 32*w + j

Design (memory bound: the prefix K/V is the only big operand):
  * grouped-query packing: one program owns BLOCK_M rows of the [G * T] matrix of
    (query head in the kv group, tree node) pairs of ONE kv head, so each K/V tile it loads
    serves all G query heads of that group (G = Hq // Hkv).
  * flash-attention online softmax in fp32 over BLOCK_N-wide prefix tiles (no mask: every node
    sees the whole prefix), then the tree's tiles (<= 2 for T <= 128) where scores are masked by
    the packed ancestor bits.
  * split-K ("flash-decoding"): the prefix is cut into NUM_SPLITS contiguous chunks on grid axis 2
    so that a few heads x a short tree still fill every SM; each split writes a normalised partial
    output and its log-sum-exp, and `_tree_attn_combine` merges them. With one split the kernel
    writes the final output directly.
  * head dims that are not powers of two (80, 96) run on a tl.arange(BLOCK_D = next pow2) tile
    with the tail masked on load and store.

Runs compiled on CUDA tensors, and interpreted (numpy) on CPU tensors when TRITON_INTERPRET=1.
`@triton.jit` decides compiled-or-interpreted when a function is decorated, i.e. at import, and
transformers imports triton early, so nothing here is frozen at import: the two kernels are wrapped
per call (`_kernels`), and the kernel bodies call only triton builtins (tl.full, tl.reduce, ...),
never the @jit library wrappers tl.zeros / tl.max / tl.sum, which were frozen when triton itself
was imported. So the interpreter works whenever TRITON_INTERPRET=1 is set before the launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .reference import check_tree_inputs
from .triton_launch import launch_plan


def _max_combine(a, b):
    return tl.maximum(a, b)


def _sum_combine(a, b):
    return a + b


# Row reductions go through the builtin tl.reduce with the combine functions tl.max / tl.sum use
# (the interpreter recognises these two objects and runs numpy max / sum; compiled code is the same
# as tl.max / tl.sum on fp32). Our own combine functions are the fallback should triton rename them.
_MAX = getattr(tl.standard, "_elementwise_max", None) or triton.jit(_max_combine)
_SUM = getattr(tl.standard, "_sum_combine", None) or triton.jit(_sum_combine)

LOG2E = 1.4426950408889634  # softmax is computed with exp2: e^x = 2^(x * log2(e))
WORD_BITS = 32


def pack_tree_mask(tree_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T, T] -> int32 [B, T, ceil(T/32)]; bit (j % 32) of word j // 32 = tree_mask[b, i, j].

    T <= 128 gives at most 4 words (16 bytes) per node. Pure torch, runs on any device.
    """
    B, T, _ = tree_mask.shape
    W = triton.cdiv(T, WORD_BITS)
    padded = torch.zeros(B, T, W * WORD_BITS, dtype=torch.int64, device=tree_mask.device)
    padded[:, :, :T] = tree_mask.to(torch.int64)
    weights = torch.bitwise_left_shift(
        torch.ones(WORD_BITS, dtype=torch.int64, device=tree_mask.device),
        torch.arange(WORD_BITS, dtype=torch.int64, device=tree_mask.device),
    )
    words = (padded.view(B, T, W, WORD_BITS) * weights).sum(-1)  # [B, T, W] in 0 .. 2^32 - 1
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement into int32 range
    return words.to(torch.int32).contiguous()


def _tree_attn_fwd(
    Q, K, V, BITS, OUT, O_PART, LSE_PART,
    sqb, sqh, sqt,  # q strides (last dim is unit-stride)
    skb, skh, skn,  # k strides
    svb, svh, svn,  # v strides
    sob, soh, sot,  # out strides
    sbb, sbt,  # tree-bits strides [B, T, W]
    B, HQ, T, prefix_len, blocks_per_split,
    qk_scale,  # softmax scale * log2(e)
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, DOT_F32: tl.constexpr,
):
    # DOT_F32 (interpreter + bf16 only): feed tl.dot fp32 copies of the bf16 operands, because the
    # triton 3.9 interpreter multiplies bf16 bit patterns as integers (triton-lang/triton#11584).
    # Values are still rounded to bf16 first, so this matches a bf16 MMA with fp32 accumulation.
    pid_m = tl.program_id(0)  # which BLOCK_M rows of the [GROUP * T] (head-in-group, node) matrix
    pid_bh = tl.program_id(1)  # b * HKV + kv head
    pid_s = tl.program_id(2)  # prefix split
    num_splits = tl.num_programs(2)
    HKV = HQ // GROUP
    b = (pid_bh // HKV).to(tl.int64)  # int64: b * batch-stride overflows int32 at B * Hkv * S * D > 2^31
    hkv = pid_bh % HKV

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M], row r = g * T + t
    row_ok = rows < GROUP * T
    t = rows % T  # tree node of each row
    h = hkv * GROUP + rows // T  # query head of each row
    d = tl.arange(0, BLOCK_D)  # [BLOCK_D] padded head dim (80 -> 128, 96 -> 128)
    d_ok = d < HEAD_DIM

    q = tl.load(Q + b * sqb + h[:, None] * sqh + t[:, None] * sqt + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + b * skb + hkv * skh
    v_base = V + b * svb + hkv * svh

    # Online softmax state per row (base 2): m = running max of s, l = sum 2^(s - m),
    # acc = sum 2^(s - m) v. m starts finite so a fully masked tile gives 2^(-inf - m) = 0, not NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)

    # ---- prefix tiles of this split: every node attends to every committed position ----
    n_start = pid_s * blocks_per_split * BLOCK_N
    n_end = tl.minimum(n_start + blocks_per_split * BLOCK_N, prefix_len)
    for start_n in range(n_start, n_end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        col_ok = cols < n_end
        kt = tl.load(k_base + cols[None, :] * skn + d[:, None],
                     mask=d_ok[:, None] & col_ok[None, :], other=0.0)  # K^T tile [BLOCK_D, BLOCK_N]
        if DOT_F32:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N] fp32, log2 units
        s = tl.where(col_ok[None, :], s, float("-inf"))
        # m' = max(m, max_j s_j);  l' = l * 2^(m - m') + sum_j 2^(s_j - m');  acc' = acc * 2^(m - m') + P V
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _MAX))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, _SUM)
        vt = tl.load(v_base + cols[:, None] * svn + d[None, :],
                     mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        pv = p.to(V.dtype.element_ty)  # P rounded to the input dtype for the tensor-core P @ V
        if DOT_F32:
            pv = pv.to(tl.float32)
            vt = vt.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, vt, input_precision=DOT_PREC)
        m_i = m_new

    # ---- tree tiles (last split only): node t sees node j iff bit j of its ancestor row is set ----
    # Same BLOCK_N-wide tiles as the prefix (T <= 128: at most 2), so register use matches the loop
    # above. Bits come from BLOCK_N / 32 per-row word loads ([BLOCK_M] each), not a [BLOCK_M, BLOCK_N]
    # gather: word w of row t holds nodes 32w .. 32w+31.
    if pid_s == num_splits - 1:
        for start_j in range(0, T, BLOCK_N):
            j = start_j + tl.arange(0, BLOCK_N)  # [BLOCK_N] tree node index
            j_ok = j < T
            kcols = prefix_len + j
            kt = tl.load(k_base + kcols[None, :] * skn + d[:, None],
                         mask=d_ok[:, None] & j_ok[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
            if DOT_F32:
                kt = kt.to(tl.float32)
            s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N]
            bit = tl.full([BLOCK_M, BLOCK_N], 0, tl.int32)
            for w in tl.static_range(BLOCK_N // 32):
                widx = start_j // 32 + w
                w_ok = row_ok & (tl.full([BLOCK_M], widx * 32, tl.int32) < T)  # word exists (< ceil(T/32))
                word = tl.load(BITS + b * sbb + t * sbt + widx, mask=w_ok, other=0)  # [BLOCK_M] int32
                bit = tl.where((j // 32 == widx)[None, :], (word[:, None] >> (j % 32)[None, :]) & 1, bit)
            s = tl.where((bit != 0) & j_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, _MAX))  # same online-softmax update as above
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, _SUM)
            vt = tl.load(v_base + kcols[:, None] * svn + d[None, :],
                         mask=j_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            pv = p.to(V.dtype.element_ty)
            if DOT_F32:
                pv = pv.to(tl.float32)
                vt = vt.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(pv, vt, input_precision=DOT_PREC)
            m_i = m_new

    # out = acc / l; a row with nothing to attend to (l = 0) gives 0, like torch SDPA.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    io_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        # partial row index ((split * B + b) * HQ + h) * T + t into O_PART [S, B, HQ, T, HEAD_DIM]
        prow = ((pid_s * B + b) * HQ + h) * T + t
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))  # log2 sum_j 2^(s_j)
        tl.store(O_PART + prow[:, None] * HEAD_DIM + d[None, :], o, mask=io_mask)
        tl.store(LSE_PART + prow, lse, mask=row_ok)
    else:
        tl.store(OUT + b * sob + h[:, None] * soh + t[:, None] * sot + d[None, :],
                 o.to(OUT.dtype.element_ty), mask=io_mask)


def _tree_attn_combine(
    O_PART, LSE_PART, OUT, B, HQ, T, num_splits,
    sob, soh, sot,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # One program per output row (b, h, t). Partials o_s were normalised by their own l_s, so with
    # lse_s = log2(l_s) + m_s:  out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M),  M = max_s lse_s.
    row = tl.program_id(0).to(tl.int64)  # (b * HQ + h) * T + t
    t = row % T
    h = (row // T) % HQ
    b = row // (T * HQ)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    prow = s * (B * HQ * T) + row  # [BLOCK_S]
    lse = tl.load(LSE_PART + prow, mask=s_ok, other=float("-inf"))
    m = tl.reduce(lse, 0, _MAX)
    m = tl.where(m == float("-inf"), 0.0, m)  # every split empty: weights 0, output 0
    w = tl.exp2(lse - m)  # [BLOCK_S]
    o = tl.load(O_PART + prow[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    den = tl.reduce(w, 0, _SUM)
    out = tl.reduce(o * w[:, None], 0, _SUM) / tl.where(den > 0.0, den, 1.0)  # [BLOCK_D]
    tl.store(OUT + b * sob + h * soh + t * sot + d, out.to(OUT.dtype.element_ty), mask=d_ok)


@functools.lru_cache(maxsize=None)
def _kernels(interpreted: bool):
    """(fwd, combine) kernel objects: numpy interpreter for CPU tensors, compiled JIT otherwise."""
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_tree_attn_fwd), InterpretedFunction(_tree_attn_combine)
    from triton.runtime.jit import JITFunction

    return JITFunction(_tree_attn_fwd), JITFunction(_tree_attn_combine)


def tree_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree_mask: torch.Tensor | None,
    prefix_len: int,
    scale: float | None = None,
    *,
    tree_bits: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Launch the kernel. Same contract as `spectui.kernels.tree_attention`, plus:

    tree_bits: int32 [B, T, >= ceil(T/32)] from `pack_tree_mask`, used instead of tree_mask
        (lets a caller pack once per step and reuse it for every layer);
    out: preallocated [B, Hq, T, D] output in q's dtype, any strides with unit last stride
        (e.g. a transposed view of a [B, T, Hq, D] buffer);
    num_splits: force the number of prefix splits (tests); default picks one per GPU;
    block_n, num_warps, num_stages: tuning overrides (benchmark sweeps); None keeps the heuristics
        of `launch_plan`.
    """
    if tree_mask is None and tree_bits is None:
        raise ValueError("tree_attention: pass tree_mask (bool [B, T, T]) or tree_bits")
    B, Hq, Hkv, T, D = check_tree_inputs(q, k, v, tree_mask, prefix_len)
    if tree_bits is None:
        tree_bits = pack_tree_mask(tree_mask)
    if (tree_bits.dtype != torch.int32 or tree_bits.dim() != 3 or tuple(tree_bits.shape[:2]) != (B, T)
            or tree_bits.shape[2] < triton.cdiv(T, WORD_BITS) or tree_bits.stride(2) != 1
            or tree_bits.device != q.device):
        words = triton.cdiv(T, WORD_BITS)
        raise ValueError(f"tree_attention: tree_bits must be int32 [B, T, >= {words}] on {q.device}, unit last stride")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if out is None:
        out = torch.empty(B, Hq, T, D, dtype=q.dtype, device=q.device)
    elif (tuple(out.shape) != (B, Hq, T, D) or out.dtype != q.dtype or out.stride(-1) != 1
          or out.device != q.device):
        raise ValueError(f"tree_attention: out must be {q.dtype} [B, Hq, T, D] = {(B, Hq, T, D)} on {q.device}, "
                         "unit last stride")
    scale = D**-0.5 if scale is None else float(scale)

    plan = launch_plan(B, Hq, Hkv, T, D, prefix_len, q.dtype, q.device, num_splits=num_splits,
                       block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    G, BLOCK_D, BLOCK_M, BLOCK_N, grid_m = Hq // Hkv, plan.block_d, plan.block_m, plan.block_n, plan.grid_m
    splits, blocks_per_split = plan.splits, plan.blocks_per_split
    num_warps, num_stages = plan.num_warps, plan.num_stages

    interpreted = q.device.type != "cuda" or bool(triton.knobs.runtime.interpret)
    fwd, combine = _kernels(interpreted)
    if splits > 1:
        o_part = torch.empty(splits, B, Hq, T, D, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(splits, B, Hq, T, dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = out  # unused (SPLIT=False)
    args = (
        q, k, v, tree_bits, out, o_part, lse_part,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        tree_bits.stride(0), tree_bits.stride(1),
        B, Hq, T, prefix_len, blocks_per_split,
        scale * LOG2E,
    )
    meta = dict(
        GROUP=G, HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SPLIT=splits > 1,
        DOT_PREC="ieee" if q.dtype == torch.float32 or interpreted else "tf32",
        DOT_F32=interpreted and q.dtype == torch.bfloat16, num_warps=num_warps,
    )
    try:
        fwd[(grid_m, B * Hkv, splits)](*args, **meta, num_stages=num_stages)
    except OutOfResources:  # smaller shared memory than planned for (consumer cards): no prefetch
        fwd[(grid_m, B * Hkv, splits)](*args, **meta, num_stages=1)
    if splits > 1:
        combine[(B * Hq * T,)](
            o_part, lse_part, out, B, Hq, T, splits,
            out.stride(0), out.stride(1), out.stride(2),
            HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_S=max(2, triton.next_power_of_2(splits)),
            num_warps=4,
        )
    return out
