"""Boost-tuning weights, the weighted loss, the training schedule, and Magpie's dedupe and filters."""

from __future__ import annotations

import math

import pytest
import torch

from spectui.engine.tune.boost import boost_weights, weighted_cross_entropy
from spectui.engine.tune.data import Example, batch_mode, split
from spectui.engine.tune.magpie import Deduper, PromptFilter, clean, normalise
from spectui.engine.tune.train import Sequence, collate, epoch_order, lr_lambda, make_batches, to_sequences


def test_missed_positions_weigh_one_and_hits_weigh_hit_weight():
    targets = torch.tensor([5, 6, 7, 8])
    ssm1 = torch.tensor([5, 0, 7, 0])  # hits positions 0 and 2
    w = boost_weights(targets, [ssm1], hit_weight=0.1)
    assert torch.allclose(w, torch.tensor([0.1, 1.0, 0.1, 1.0]))


def test_a_position_is_hit_when_any_earlier_ssm_hits():
    targets = torch.tensor([[1, 2, 3, 4]])  # [B=1, T=4]
    ssm1 = torch.tensor([[1, 0, 0, 0]])  # hits position 0
    ssm2 = torch.tensor([[0, 2, 0, 0]])  # hits position 1
    w = boost_weights(targets, torch.stack([ssm1, ssm2]), hit_weight=0.25)  # earlier_top1 [K=2, B, T]
    assert w.tolist() == [[0.25, 0.25, 1.0, 1.0]]
    assert boost_weights(targets, [ssm2, ssm1], 0.25).tolist() == w.tolist()  # order of SSMs does not matter


def test_first_ssm_weighs_every_position_one():
    targets = torch.tensor([3, 1, 4])
    assert boost_weights(targets, [], hit_weight=0.1).tolist() == [1.0, 1.0, 1.0]


def test_weighted_cross_entropy_ignores_zero_weight_positions_and_chunks_add_up():
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2, 3, 4, 5, 6])
    weights = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 1.0])
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    expected = (weights * ce).sum() / weights.sum()
    assert torch.allclose(weighted_cross_entropy(logits, targets, weights), expected)
    total = weights.sum()
    chunked = weighted_cross_entropy(logits[:3], targets[:3], weights[:3], total) + weighted_cross_entropy(
        logits[3:], targets[3:], weights[3:], total
    )
    assert torch.allclose(chunked, expected)
    changed = logits.clone()
    changed[1] = 100.0 * torch.randn(11)  # a zero-weight position cannot move the loss
    assert torch.allclose(weighted_cross_entropy(changed, targets, weights), expected)


def test_sequences_put_the_loss_on_answer_tokens_only():
    ex = Example("p", [10, 11, 12], [20, 21, 2], "greedy", True)
    (seq,) = to_sequences([ex], max_seq_len=64)
    assert seq.targets == [20, 21, 2]
    ids, mask = collate([seq, Sequence([1, 2, 3], 1)])
    assert ids[:, 1:][mask[:, :-1]].tolist() == [20, 21, 2, 3]  # row-major, answer positions only
    (cut,) = to_sequences([ex], max_seq_len=4)  # truncation keeps the end, and the targets it can
    assert cut.ids == [12, 20, 21, 2] and cut.targets == [20, 21, 2]


def test_batches_respect_the_token_budget_and_cover_every_sequence_once():
    seqs = [Sequence(list(range(n)), 0) for n in (5, 30, 7, 12, 30, 3, 9)]
    groups = make_batches(seqs, batch_tokens=40)
    assert sorted(i for g in groups for i in g) == list(range(len(seqs)))
    assert all(len(g) * max(len(seqs[i].ids) for i in g) <= 40 for g in groups)
    assert epoch_order(len(groups), 0, 1, 0) == epoch_order(len(groups), 0, 1, 0)  # reproducible on resume


def test_schedule_warms_up_then_decays_to_the_floor():
    f = lr_lambda(total=100, warmup=10, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(100) == pytest.approx(0.1)
    assert f(55) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_greedy_batches_are_spread_at_the_asked_rate():
    modes = [batch_mode(i, 0.5) for i in range(8)]
    assert modes == ["greedy", "sample"] * 4
    assert {batch_mode(i, 0.0) for i in range(5)} == {"sample"}
    assert {batch_mode(i, 1.0) for i in range(5)} == {"greedy"}
    assert sum(batch_mode(i, 0.25) == "greedy" for i in range(100)) == 25


def test_split_is_by_prompt_and_never_empty_on_either_side():
    examples = [Example(f"prompt {i}", [1], [2], "sample", True) for i in range(200)]
    train, held = split(examples + [Example("PROMPT  7", [1], [3], "greedy", True)], 0.1)
    held_prompts = {normalise(e.prompt) for e in held}
    assert not held_prompts & {normalise(e.prompt) for e in train}  # one prompt, one side
    assert 5 <= len(held) <= 40
    train, held = split(examples[:2], 0.05)
    assert len(train) == 1 and len(held) == 1


def test_dedupe_is_case_and_whitespace_insensitive():
    d = Deduper(["What is AI?"])
    assert not d.add("what  is\nai?")
    assert d.add("What is ML?")
    assert not d.add("WHAT IS ML?")


def test_filter_rejects_short_long_unprintable_template_and_bench_prompts():
    f = PromptFilter(min_chars=15, max_chars=60, min_printable=0.95, forbidden=("<|im_start|>", "ASSISTANT:"),
                     excluded={normalise("How can I improve my time management skills?")})
    assert f.reject_reason("Explain how rainbows form, briefly.") is None
    assert f.reject_reason("Hi there") == "length"
    assert f.reject_reason("x" * 61) == "length"
    assert f.reject_reason("Tell me a story \x07\x07\x07\x07\x07 about cats") == "unprintable"
    assert f.reject_reason("Broken bytes here \ufffd in the middle") == "unprintable"
    assert f.reject_reason("Hello<|im_start|>assistant how are you") == "template"
    assert f.reject_reason("how can I improve my  time management skills?") == "bench"


def test_clean_cuts_at_the_end_of_the_turn():
    assert clean("  Why is the sky blue?<|im_end|>\n<|im_start|>assistant", "<|im_end|>") == ("Why is the sky blue?", True)
    assert clean("An unfinished question about", "<|im_end|>") == ("An unfinished question about", False)
