"""plan_groups (engine/batch_generate.py): how a batch of prompts is cut into groups by length."""

from __future__ import annotations

from spectui.engine.batch_generate import StepCost, plan_groups


def total(groups, lengths, new, cost=StepCost()):
    return sum(cost.group(len(g), max(lengths[b] for b in g), new) for g in groups)


def test_similar_lengths_stay_one_batch():
    lengths = [40, 52, 47, 60, 38, 45]
    assert plan_groups(lengths, 200) == [sorted(range(6), key=lambda b: lengths[b])]


def test_a_long_prompt_is_decoded_apart():
    lengths = [40] * 15 + [600]
    groups = plan_groups(lengths, 200)
    assert groups == [list(range(15)), [15]]
    assert total(groups, lengths, 200) < total([list(range(16))], lengths, 200)


def test_the_plan_is_the_cheapest_cut_and_covers_every_prompt():
    lengths = [900, 30, 410, 35, 420, 28, 880, 400]
    groups = plan_groups(lengths, 100)
    assert sorted(b for g in groups for b in g) == list(range(8))
    order = sorted(range(8), key=lambda b: lengths[b])
    for cut in range(1, 8):  # no single cut of the sorted batch beats it
        assert total(groups, lengths, 100) <= total([order[:cut], order[cut:]], lengths, 100)
    assert total(groups, lengths, 100) <= total([order], lengths, 100)
