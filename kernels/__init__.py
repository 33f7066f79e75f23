"""Tree attention for SpecInfer-style verification: Triton kernel, torch reference, backend choice.

    from spectui.kernels import tree_attention
    out = tree_attention(q, k, v, tree_mask, prefix_len)   # [B, Hq, T, D]

`spectui.kernels.hf_attention.register_tree_attention()` plugs it into transformers models as
attn_implementation="spectui_tree". Importing this package does not import triton.
"""

from .backend import AttentionBackendError, resolve_backend, tree_attention
from .reference import tree_attention_reference

__all__ = ["tree_attention", "tree_attention_reference", "resolve_backend", "AttentionBackendError"]
