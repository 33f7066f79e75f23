"""Distillation loss: the verifier's soft targets mixed with the tokens it emitted, boost-weighted.

For an answer position t with the verifier's token y_t, its top-K tokens v_1..v_K with
log-probabilities l_1..l_K (teacher.py), renormalised p_j = exp(l_j) / sum_i exp(l_i), and the
SSM's log-probabilities log q_t over the whole vocabulary:

    soft_t = - sum_j p_j log q_t(v_j)     cross-entropy to the verifier's top-K distribution
                                          (= KL(p || q_t) + H(p): the KL up to a constant)
    hard_t = - log q_t(y_t)               the token the verifier emitted
    L      = sum_t w_t [a soft_t + (1 - a) hard_t] / sum_t w_t      a = soft_weight, w_t: boost.py

a = 0 is boost.weighted_cross_entropy. With prompt_weight > 0 the prompt's positions (the user's
text, teacher-forced through the verifier) join with weight prompt_weight and the soft term alone
(a = 1: the user's next token is no target, the verifier's distribution there is): the cheap way to
more verifier tokens, since a prompt costs a prefill while an answer token costs a decode step. For greedy answers y_t = v_1, so the soft term adds what
the verifier would have said second; for sampled answers y_t is a draw from the verifier, and the
soft term is (nearly) its expectation: the same target with less variance (DistillSpec).
"""

from __future__ import annotations

from dataclasses import replace

import torch


def distill_loss(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, top_ids: torch.Tensor,
    top_logp: torch.Tensor, soft_weight: float | torch.Tensor, normaliser: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """logits [N, V], targets [N], weights [N], top_ids/top_logp [N, K], soft_weight scalar or [N] -> L (a scalar)."""
    logq = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    hard = -logq.gather(1, targets[:, None].long())[:, 0]  # [N]
    p = torch.softmax(top_logp.float(), dim=-1)  # [N, K], renormalised over the top K
    soft = -(p * logq.gather(1, top_ids.long())).sum(dim=-1)  # [N]
    per_position = soft_weight * soft + (1.0 - soft_weight) * hard  # [N]
    total = weights.sum().clamp_min(1e-8) if normaliser is None else normaliser
    return (weights * per_position).sum() / total


def answer_rows(rows: list[tuple[torch.Tensor, torch.Tensor]], seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher rows of the answer positions of a batch, in collate's row-major order -> ([N, K], [N, K]).

    rows[b] covers positions 0..len-2 of seqs[b]; the answer positions are start..len-2.
    """
    ids = torch.cat([r[0][s.start : len(s.ids) - 1] for r, s in zip(rows, seqs)])
    logp = torch.cat([r[1][s.start : len(s.ids) - 1] for r, s in zip(rows, seqs)])
    return ids, logp


def with_prompt_positions(seqs, weights: list[torch.Tensor], prompt_weight: float, soft_weight: float):
    """A batch's loss extended to its prompt positions -> (sequences from position 0, weights [N], soft [N]).

    weights[b] covers seqs[b]'s answer positions; prompt positions weigh prompt_weight, soft only.
    """
    w = torch.cat([torch.cat([torch.full((s.start,), prompt_weight), wb]) for s, wb in zip(seqs, weights)])
    soft = torch.cat([torch.cat([torch.ones(s.start), torch.full((len(s.targets),), soft_weight)]) for s in seqs])
    return [replace(s, start=0) for s in seqs], w, soft
