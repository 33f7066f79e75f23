"""Torch reference for tree attention: masked scaled-dot-product attention (SDPA).

This is the definition every other backend is tested against, and the "torch" backend used on
CPU. Each of the T tree nodes (queries) attends to every position of the committed prefix and to
the tree nodes its ancestor mask allows:

    out[b, h, i] = softmax_j( scale * q[b, h, i] . k[b, h // G, j] )  over allowed j  @ v

with G = Hq // Hkv (grouped-query attention) and "allowed j" = {0 .. prefix_len-1} plus
{prefix_len + n : tree_mask[b, i, n]}. Implemented by building the dense boolean mask
[B, 1, T, prefix_len + T] and calling torch.nn.functional.scaled_dot_product_attention.

`check_tree_inputs` (shared with the Triton launcher) validates shapes, dtypes and ranges and
raises ValueError with one clear line per problem.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_TREE_NODES = 128  # T upper bound (the Triton kernel packs a node's mask row in <= 4 int32 words)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def check_tree_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree_mask: torch.Tensor | None,
    prefix_len: int,
    dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES,
) -> tuple[int, int, int, int, int]:
    """Validate the tree-attention operands; return (B, Hq, Hkv, T, D).

    q: [B, Hq, T, D]; k, v: [B, Hkv, prefix_len + T, D]; tree_mask: bool [B, T, T] (None: caller passes
    a pre-packed mask instead). `dtypes`: accepted dtypes (the reference also takes float64).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"tree_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"tree_attention: {name} must be 4-D [B, H, L, D], got shape {tuple(t.shape)}")
    if q.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"tree_attention: dtype {q.dtype} unsupported (use {names})")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"tree_attention: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"tree_attention: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    B, Hq, T, D = q.shape
    Bk, Hkv, S, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"tree_attention: k shape {tuple(k.shape)} != v shape {tuple(v.shape)}")
    if Bk != B or Dk != D:
        raise ValueError(f"tree_attention: q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head dim")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"tree_attention: query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if not 1 <= T <= MAX_TREE_NODES:
        raise ValueError(f"tree_attention: tree size T={T} outside 1..{MAX_TREE_NODES}")
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f"tree_attention: head dim D={D} outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
        raise ValueError(f"tree_attention: prefix_len must be a non-negative int, got {prefix_len!r}")
    if S != prefix_len + T:
        raise ValueError(f"tree_attention: k/v length {S} != prefix_len ({prefix_len}) + T ({T})")
    if tree_mask is not None:
        if not isinstance(tree_mask, torch.Tensor) or tree_mask.dtype != torch.bool:
            raise ValueError("tree_attention: tree_mask must be a torch.bool tensor [B, T, T]")
        if tuple(tree_mask.shape) != (B, T, T):
            raise ValueError(f"tree_attention: tree_mask shape {tuple(tree_mask.shape)} != (B, T, T) = {(B, T, T)}")
        if tree_mask.device != q.device:
            raise ValueError(f"tree_attention: tree_mask on {tree_mask.device}, q on {q.device}")
    return B, Hq, Hkv, T, D


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """parents[i] < i (-1 for a root; several roots make a forest) -> bool [T, T], [i, j] True iff j
    is i or an ancestor of i: the tree_mask of one tree (engine/tree.py builds the engine's own)."""
    rows: list[list[bool]] = []
    for i, p in enumerate(parents):
        row = list(rows[p]) if p >= 0 else [False] * len(parents)
        row[i] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).view(len(parents), len(parents))


def dense_tree_mask(tree_mask: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[B, T, T] ancestor mask -> dense SDPA mask [B, 1, T, prefix_len + T] (True = attend)."""
    B, T, _ = tree_mask.shape
    prefix = torch.ones(B, T, prefix_len, dtype=torch.bool, device=tree_mask.device)
    return torch.cat([prefix, tree_mask], dim=-1).unsqueeze(1)


def tree_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor, prefix_len: int,
                             scale: float | None = None) -> torch.Tensor:
    """Tree attention by masked SDPA. q [B, Hq, T, D], k/v [B, Hkv, prefix_len+T, D] -> [B, Hq, T, D].

    Also accepts float64 (for tests). Rows with nothing to attend to (impossible for a real tree:
    the diagonal is always set) give 0, as torch SDPA does.
    """
    dtypes = SUPPORTED_DTYPES + (torch.float64,)
    _, Hq, Hkv, _, D = check_tree_inputs(q, k, v, tree_mask, prefix_len, dtypes)
    if scale is None:
        scale = D**-0.5
    if Hq != Hkv:  # GQA: expand kv heads to query heads (head h reads kv head h // G)
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
    mask = dense_tree_mask(tree_mask, prefix_len)  # [B, 1, T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
