"""Collective boost-tuning: per-position weights that point SSM k at what SSMs 1..k-1 miss.

SpecInfer (section 4) fine-tunes SSM 1 on all the data, drops the samples where SSM 1 already
matches the LLM, trains SSM 2 on the rest, and so on, so that the SSMs together cover more of the
LLM's outputs than any one of them. Here the selection is soft and per token: for a target token
y_t of the verifier and earlier SSMs with top-1 predictions a_t^(1..k-1),

    w_t = 1           if a_t^(j) != y_t for every earlier SSM j   (missed: the tree needs SSM k here)
    w_t = hit_weight  otherwise                                   (already proposed by the tree)

and SSM k minimises the weighted cross-entropy  L = sum_t w_t CE_t / sum_t w_t.
A small hit_weight (0.1) rather than 0 keeps SSM k a sane language model on the easy positions,
which it must still follow to stay on the verifier's path during multi-token drafts.
"""

from __future__ import annotations

import torch


def boost_weights(targets: torch.Tensor, earlier_top1: torch.Tensor | list[torch.Tensor], hit_weight: float) -> torch.Tensor:
    """targets [...] (verifier tokens), earlier_top1 [K, ...] (top-1 of each earlier SSM) -> weights [...].

    With no earlier SSM (K = 0) every position weighs 1.
    """
    if isinstance(earlier_top1, (list, tuple)):
        earlier_top1 = torch.stack(list(earlier_top1)) if earlier_top1 else targets.new_empty((0, *targets.shape))
    if earlier_top1.shape[0] == 0:
        return torch.ones(targets.shape, dtype=torch.float32, device=targets.device)
    hit = (earlier_top1 == targets.unsqueeze(0)).any(dim=0)  # [...]: some earlier SSM proposes y_t
    return torch.where(hit, torch.tensor(hit_weight, dtype=torch.float32), torch.tensor(1.0)).to(targets.device)


def weighted_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, normaliser: torch.Tensor | float | None = None
) -> torch.Tensor:
    """logits [N, V], targets [N], weights [N] -> sum_t w_t CE_t / sum_t w_t (a scalar).

    Pass `normaliser` (the batch's sum of weights) when the batch is split into chunks of positions.
    """
    ce = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")  # [N]
    total = weights.sum().clamp_min(1e-8) if normaliser is None else normaliser
    return (weights * ce).sum() / total
