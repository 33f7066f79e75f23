"""Backend selection for tree attention, and the public `tree_attention` entry point.

SPECTUI_ATTENTION=triton|torch|exact|auto (default auto):
  auto   -> exact on CPU; Triton kernel for CUDA tensors (when triton imports), else torch;
  triton -> the Triton kernel; on CPU tensors only under TRITON_INTERPRET=1 (numpy interpreter);
  torch  -> the torch reference (masked SDPA), any device;
  exact  -> layout-invariant attention (exact_attention.py; float32 in a fixed order in C on AVX2,
            else float64 in torch): a token's output has the
            same bits in a tree pass as in a one-token decode, which keeps bitsandbytes' fused
            bf16 4-bit kernel lossless on CPU.
A request the machine cannot honour raises AttentionBackendError with one line saying why.
"""

from __future__ import annotations

import functools
import os

import torch

from .reference import check_tree_inputs, tree_attention_reference

ENV_VAR = "SPECTUI_ATTENTION"
CHOICES = ("auto", "triton", "torch", "exact")


class AttentionBackendError(RuntimeError):
    """The requested attention backend cannot run here (bad value, triton missing, CPU without interpreter)."""


@functools.lru_cache(maxsize=1)
def _triton_import_error() -> str | None:
    """None when `import triton` works, else the error text (cached: imports are not retried)."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising something else
        return f"{type(exc).__name__}: {exc}"
    return None


def _interpret_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def resolve_backend(device: torch.device | str, requested: str | None = None) -> str:
    """Return "triton", "torch" or "exact" for tensors on `device`.

    `requested` overrides the SPECTUI_ATTENTION environment variable (both default to "auto").
    """
    device = torch.device(device)
    raw = requested if requested is not None else os.environ.get(ENV_VAR, "auto")
    choice = str(raw).strip().lower() or "auto"
    if choice not in CHOICES:
        raise AttentionBackendError(f"{ENV_VAR}={raw!r} is not one of {', '.join(CHOICES)}")
    if choice in ("torch", "exact"):
        return choice
    if choice == "auto":
        if device.type == "cpu":
            return "exact"
        return "triton" if device.type == "cuda" and _triton_import_error() is None else "torch"
    # choice == "triton"
    err = _triton_import_error()
    if err is not None:
        raise AttentionBackendError(f"{ENV_VAR}=triton but triton cannot be imported ({err})")
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu":
        if _interpret_enabled():
            return "triton"
        raise AttentionBackendError(
            f"{ENV_VAR}=triton needs CUDA tensors, or TRITON_INTERPRET=1 for CPU tensors (got device {device})"
        )
    raise AttentionBackendError(f"{ENV_VAR}=triton does not support device {device} (use CUDA, or torch)")


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor, prefix_len: int,
                   scale: float | None = None, backend: str | None = None) -> torch.Tensor:
    """Attention of T tree nodes over a committed prefix plus their ancestors.

    q: [B, Hq, T, D]; k, v: [B, Hkv, prefix_len + T, D] (prefix, then the tree nodes; Hq % Hkv == 0);
    tree_mask: bool [B, T, T], True iff node j is node i or an ancestor of i. Node i attends to every
    prefix position and to the nodes its mask row allows. scale defaults to D ** -0.5.
    backend: "triton" | "torch" | "exact" | "auto" | None (None: SPECTUI_ATTENTION, default auto).
    Returns [B, Hq, T, D] in q's dtype. Raises ValueError on bad inputs, AttentionBackendError on a
    backend this machine cannot run.
    """
    check_tree_inputs(q, k, v, tree_mask, prefix_len)
    chosen = resolve_backend(q.device, backend)
    if chosen == "triton":
        from .triton_tree import tree_attention_triton

        return tree_attention_triton(q, k, v, tree_mask, prefix_len, scale)
    if chosen == "exact":
        from .exact_attention import exact_attention
        from .reference import dense_tree_mask

        return exact_attention(q, k, v, dense_tree_mask(tree_mask, prefix_len), scale)
    return tree_attention_reference(q, k, v, tree_mask, prefix_len, scale)
