"""The distillation loss (engine/tune/distill.py): its limits, its maths and what it teaches."""

from __future__ import annotations

import pytest
import torch

from spectui.engine.tune.boost import weighted_cross_entropy
from spectui.engine.tune.distill import answer_rows, distill_loss
from spectui.engine.tune.train import Sequence


def test_without_soft_weight_it_is_the_boosted_label_loss():
    torch.manual_seed(0)
    logits, targets, weights = torch.randn(6, 50), torch.randint(0, 50, (6,)), torch.rand(6)
    top_ids, top_logp = torch.randint(0, 50, (6, 4)), torch.randn(6, 4)
    assert torch.allclose(distill_loss(logits, targets, weights, top_ids, top_logp, 0.0),
                          weighted_cross_entropy(logits, targets, weights))


def test_soft_term_is_kl_plus_entropy_on_the_whole_vocabulary():
    torch.manual_seed(1)
    V = 20
    logits, teacher = torch.randn(3, V), torch.randn(3, V)
    log_p = torch.log_softmax(teacher, -1)
    ids = torch.arange(V).expand(3, V)  # K = V: the soft target is the teacher's whole distribution
    loss = distill_loss(logits, torch.zeros(3, dtype=torch.long), torch.ones(3), ids, log_p, 1.0)
    p, log_q = log_p.exp(), torch.log_softmax(logits, -1)
    kl = (p * (log_p - log_q)).sum(-1)
    entropy = -(p * log_p).sum(-1)
    assert torch.allclose(loss, (kl + entropy).mean(), atol=1e-5)


def test_minimising_it_teaches_the_teachers_top_k_distribution():
    """The soft term's minimiser puts the renormalised top-K probabilities on the top-K tokens."""
    torch.manual_seed(2)
    V, K = 30, 4
    top_ids = torch.tensor([[3, 7, 11, 20]])
    top_logp = torch.log(torch.tensor([[0.5, 0.2, 0.1, 0.05]]))  # mass 0.85: renormalised to /0.85
    logits = torch.zeros(1, V, requires_grad=True)
    optimiser = torch.optim.Adam([logits], lr=0.1)
    for _ in range(600):
        optimiser.zero_grad()
        distill_loss(logits, top_ids[:, 0], torch.ones(1), top_ids, top_logp, 1.0).backward()
        optimiser.step()
    q = torch.softmax(logits.detach(), -1)[0]
    expected = torch.tensor([0.5, 0.2, 0.1, 0.05]) / 0.85
    assert torch.allclose(q[top_ids[0]], expected, atol=0.02)
    assert q[top_ids[0]].argmax() == 0


def test_answer_rows_follow_collates_row_major_answer_positions():
    seqs = [Sequence([1, 2, 3, 4, 5], start=2), Sequence([6, 7, 8], start=0)]
    rows = []
    for s in seqs:  # row t holds (t, 10 t) so the picked positions are visible
        n = len(s.ids) - 1
        rows.append((torch.arange(n)[:, None].repeat(1, 2).int(), (10 * torch.arange(n))[:, None].repeat(1, 2).half()))
    ids, logp = answer_rows(rows, seqs)
    assert ids[:, 0].tolist() == [2, 3, 0, 1]  # positions 2..3 of the first, 0..1 of the second
    assert logp[:, 0].tolist() == [20, 30, 0, 10]
    assert ids.shape[0] == sum(len(s.targets) for s in seqs)


def test_prompt_positions_join_with_their_weight_and_soft_targets_only():
    from spectui.engine.tune.distill import with_prompt_positions

    seqs = [Sequence([1, 2, 3, 4, 5], start=2), Sequence([6, 7, 8], start=1)]
    boost = [torch.tensor([1.0, 0.1]), torch.tensor([1.0])]
    extended, w, soft = with_prompt_positions(seqs, boost, 0.3, 0.7)
    assert [s.start for s in extended] == [0, 0] and [s.ids for s in extended] == [s.ids for s in seqs]
    assert w.tolist() == pytest.approx([0.3, 0.3, 1.0, 0.1, 0.3, 1.0])
    assert soft.tolist() == pytest.approx([1, 1, 0.7, 0.7, 1, 0.7])
    assert w.numel() == sum(len(s.targets) for s in extended)
