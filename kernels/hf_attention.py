"""transformers integration: attn_implementation="spectui_tree".

`register_tree_attention()` registers
  * `tree_attention_forward` in transformers.AttentionInterface, and
  * transformers' own `sdpa_mask` in transformers.masking_utils.AttentionMaskInterface.
The second matters: `create_causal_mask` (via `_preprocess_mask_arguments`) returns mask=None for
any implementation missing from AttentionMaskInterface, which would turn a chunked prefill over a
cache (q_len > 1, kv_len > q_len) into sdpa's upper-left `is_causal` mask, i.e. wrong attention.
With `sdpa_mask` registered, prefill gets exactly what "sdpa" gets: None when `is_causal` is
exact (q_len == kv_len or q_len == 1, no padding), else a materialised boolean [B, 1, q, kv] mask.
A 4-D mask passed in by the caller (the verifier's tree mask) is returned as-is by transformers.

`tree_attention_forward` recognises a tree-verification call -- a 4-D bool mask [B|1, 1, T, S]
(True = attend) whose first S - T columns (the committed prefix) are all True, T <= 128 -- and
runs `tree_attention` on it with tree_mask = mask[:, 0, :, S-T:] and prefix_len = S - T. Anything
else (mask None, T > 128, padded prefix, float masks, softcap, dropout, sliding windows) goes to
transformers' `sdpa_attention_forward`. `last_backend()` says which path ran last.
"""

from __future__ import annotations

import threading

import torch

from .backend import resolve_backend
from .exact_attention import exact_attention
from .reference import MAX_HEAD_DIM, MAX_TREE_NODES, MIN_HEAD_DIM, SUPPORTED_DTYPES, tree_attention_reference

ATTN_NAME = "spectui_tree"
EXACT_NAME = "spectui_exact"

_state: dict = {"last_backend": None, "registered": False}
# Per-thread one-entry cache: every layer of a forward gets the same mask tensor, so its prefix is
# checked and its bits packed once per forward instead of once per layer (the check costs a device
# sync). An entry is reused only for the same tensor object at a higher layer index of the same
# forward: a new forward restarts at a lower layer, so a mask buffer refilled in place between
# steps (inference tensors have no version counter to tell) is always re-read.
_local = threading.local()


def last_backend() -> str | None:
    """Which path the last attention call took: "triton", "torch", "exact" or "sdpa-fallback"."""
    return _state["last_backend"]


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors do not track versions
        return None


def _tree_part(mask: torch.Tensor | None, batch: int, T: int, S: int, layer: int | None) -> dict | None:
    """Cache entry {"tree": bool [B, T, T], "bits": packed or None} if `mask` is a tree-verification
    mask (4-D bool [B|1, 1, T, S], first S - T columns all True), else None."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
        return None
    if mask.shape[0] not in (1, batch) or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (T, S):
        return None
    c = getattr(_local, "entry", None)
    if (c is not None and c["mask"] is mask and c["version"] == _version(mask) and c["T"] == T
            and layer is not None and c["layer"] is not None and layer > c["layer"]):
        c["layer"] = layer
        return c if c["tree"] is not None else None
    prefix_len = S - T
    tree = None
    if prefix_len == 0 or bool(mask[:, :, :, :prefix_len].all()):
        tree = mask[:, 0, :, prefix_len:].expand(batch, T, T).contiguous()  # [B, T, T]
    _local.entry = c = dict(mask=mask, version=_version(mask), T=T, layer=layer, tree=tree, bits=None)
    return c if tree is not None else None


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface. query [B, Hq, T, D]; key/value [B, Hkv, S, D] (cache included).

    Returns (attn_output [B, T, Hq, D] contiguous, None), like sdpa_attention_forward.
    """
    B, Hq, T, D = query.shape
    S = key.shape[2]
    usable = (
        dropout == 0.0
        and T <= MAX_TREE_NODES
        and S >= T
        and query.dtype in SUPPORTED_DTYPES
        and key.dtype == value.dtype == query.dtype
        and MIN_HEAD_DIM <= D <= MAX_HEAD_DIM
        and key.shape[-1] == value.shape[-1] == D
        and key.shape[1] > 0
        and Hq % key.shape[1] == 0
        and all(kwargs.get(name) is None for name in ("softcap", "position_bias", "sliding_window", "cache"))
    )
    entry = _tree_part(attention_mask, B, T, S, getattr(module, "layer_idx", None)) if usable else None
    if entry is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _state["last_backend"] = "sdpa-fallback"
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)

    backend = resolve_backend(query.device)
    if backend == "triton":
        from .triton_tree import pack_tree_mask, tree_attention_triton

        if entry["bits"] is None:
            entry["bits"] = pack_tree_mask(entry["tree"])  # int32 [B, T, ceil(T/32)], once per forward
        out = torch.empty(B, T, Hq, D, dtype=query.dtype, device=query.device)  # [B, T, Hq, D]
        tree_attention_triton(query, key, value, None, S - T, scaling,
                              tree_bits=entry["bits"], out=out.transpose(1, 2))  # writes the [B, Hq, T, D] view
    else:
        out = tree_attention_reference(query, key, value, entry["tree"], S - T, scaling)
        out = out.transpose(1, 2).contiguous()  # [B, T, Hq, D]
    _state["last_backend"] = backend
    return out, None


def exact_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention interface for the "exact" backend: every call -- prefill, one-token
    decode, tree verification -- goes through the same layout-invariant attention, so a token's
    output is the same bits however it was batched. Same arguments as `tree_attention_forward`;
    returns (attn_output [B, T, Hq, D], None)."""
    if dropout or any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "sliding_window")):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _state["last_backend"] = "sdpa-fallback"
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    out = exact_attention(query, key, value, attention_mask, scaling)  # [B, Hq, T, D]
    _state["last_backend"] = "exact"
    return out.transpose(1, 2).contiguous(), None


def register_tree_attention(backend: str = "auto") -> str:
    """Register spectui's attention with transformers (idempotent); return the attn_implementation
    name for `backend`: "spectui_exact" for "exact", else "spectui_tree" (Triton or masked SDPA)."""
    if not _state["registered"]:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTN_NAME, tree_attention_forward)
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
        AttentionInterface.register(EXACT_NAME, exact_attention_forward)
        AttentionMaskInterface.register(EXACT_NAME, sdpa_mask)
        _state["registered"] = True
    return EXACT_NAME if backend == "exact" else ATTN_NAME
