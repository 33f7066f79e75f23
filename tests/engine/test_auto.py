"""The adaptive engine end to end: cost model cache, measured speed-up, chat turns reusing the KV cache."""

from __future__ import annotations

import pytest
import torch

from spectui.engine.calibrate import prepare_costs
from spectui.engine.chat import Conversation, chat_turn, encode_chat
from spectui.engine.costs import CostKey, CostModel
from spectui.engine.drafters import NGramDrafter
from spectui.engine.settings import GenerationSettings
from spectui.engine.speculative import SpeculativeEngine
from spectui.engine.speedup import MIN_PURE


@pytest.fixture()
def engine(embedded_models):
    m = embedded_models
    return SpeculativeEngine(m.verifier, m.tokenizer, [NGramDrafter()], m.stop_token_ids())


def test_cost_model_is_measured_once_per_key(engine, tmp_path):
    key = CostKey("smollm2-135m", "nf4", "cpu", torch.get_num_threads())
    first = prepare_costs(engine, tmp_path, key)
    assert not first.from_cache and 0 < first.measured_s < 30  # about 1-4 s here; a loaded CI machine is slower
    assert first.verify(1) > 0 and first.verify(32) >= first.verify(1)  # non-decreasing in tree size
    again = prepare_costs(engine, tmp_path, key)
    assert again.from_cache and again.verify_table == first.verify_table and again.measured_s == 0
    other = prepare_costs(engine, tmp_path, CostKey("smollm2-135m", "nf4", "cpu", 99))
    assert not other.from_cache  # another thread count: measured again


def test_speedup_is_one_without_speculation_and_measured_with_it(engine, embedded_models):
    ids = encode_chat(embedded_models.tokenizer, [{"role": "user", "content": "Name three colours."}])
    plain = list(engine.generate(ids, GenerationSettings(max_new_tokens=12, speculate=False)))
    assert all(e.speedup == 1.0 and e.incremental_ms == e.step_ms for e in plain[1:])
    assert plain[0].speedup is None  # the prefill is no decode step
    auto = list(engine.generate(ids, GenerationSettings(max_new_tokens=12)))
    assert all(e.speedup is not None and e.speedup > 0 for e in auto[1:])
    assert [t for e in auto for t in e.new_tokens] == [t for e in plain for t in e.new_tokens]
    assert all(e.step_ms > 0 for e in auto) and auto[-1].tokens_per_s > 0


def test_chat_turns_prefill_only_what_is_new(engine, embedded_models):
    m = embedded_models
    conversation = Conversation()
    settings = GenerationSettings(max_new_tokens=16)
    prefilled = []
    for turn in ["Hi! Who are you?", "Name a fruit.", "And a vegetable?", "Which is sweeter?", "Thanks, bye."]:
        conversation.add("user", turn)
        answer = [t for e in chat_turn(engine, m, conversation, settings) for t in e.new_tokens]
        prefilled.append(engine.prefilled)
        prompt, _ = conversation.prompt_ids(m.tokenizer, m.context_window, 16)
        full = len(prompt) + 16
    assert prefilled[0] > 20
    assert all(p < 40 for p in prefilled[1:]), prefilled  # the new user turn (plus template), not the history
    assert full > 100  # while the conversation itself grew well past that

    # the reused cache changes nothing: the fifth answer equals a fresh engine's answer
    conversation.messages.pop()  # the fifth answer
    ids, _ = conversation.prompt_ids(m.tokenizer, m.context_window, 16)
    fresh = SpeculativeEngine(m.verifier, m.tokenizer, [NGramDrafter()], m.stop_token_ids())
    expected = [t for e in fresh.generate(ids, settings) for t in e.new_tokens]
    assert answer == expected


def test_what_the_auto_tree_learned_outlives_the_engine(embedded_models, tmp_path):
    from spectui.engine.acceptance_model import REMEMBERED, acceptance_path

    m = embedded_models
    path = acceptance_path(tmp_path, "smollm2-135m:ngram", "nf4")
    first = SpeculativeEngine(m.verifier, m.tokenizer, [NGramDrafter()], m.stop_token_ids())
    assert not first.remember_acceptance(path)  # nothing saved yet
    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."
    ids = encode_chat(m.tokenizer, [{"role": "user", "content": prompt}])
    list(first.generate(ids, GenerationSettings(max_new_tokens=40)))
    learned = {k: c for k, c in first.acceptance_model.cells.items() if c.trials}
    assert learned and path.exists()  # saved after the answer
    second = SpeculativeEngine(m.verifier, m.tokenizer, [NGramDrafter()], m.stop_token_ids())
    assert second.remember_acceptance(path)
    for key, cell in learned.items():  # the same estimates before its first step
        kept = second.acceptance_model.cells[key]
        assert kept.trials == min(cell.trials, REMEMBERED) and kept.mean == pytest.approx(cell.mean, abs=0.05)


def test_no_tree_reaches_past_the_answers_length_limit(embedded_models):
    """An auto tree drafts no deeper than the tokens the answer may still take, less its bonus token, and
    the step that may add one token drafts nothing: nodes past the limit would be verified for nothing."""
    m = embedded_models
    engine = SpeculativeEngine(m.verifier, m.tokenizer, [NGramDrafter()], m.stop_token_ids())
    engine.cost_model = CostModel({1: 50.0, 2: 50.5, 4: 51.0, 8: 52.0, 16: 54.0, 32: 58.0})  # rows nearly free
    text = "Count the colours: red blue green red blue green red blue green red blue green red"
    ids = encode_chat(m.tokenizer, [{"role": "user", "content": text}]) + m.tokenizer.encode(" red blue green red blue")
    auto = engine.auto_drafting()
    free, _, _ = auto.draft(ids, engine.drafters, "union")
    assert max(free.depths) >= 4  # the n-gram drafter's matches run deep here
    for deepest in (1, 2, 3):
        tree, _, _ = auto.draft(ids, engine.drafters, "union", max_depth=deepest)
        assert max(tree.depths) == deepest and all(p < i for i, p in enumerate(tree.parents))
    engine.verifier.reset()
    engine.verifier.forward_chain(ids[:-1])  # the cache: all but the root
    for _ in range(MIN_PURE):  # one-token steps timed here already: no calibration step is due
        engine.pure_steps.record(len(ids), 50.0, pure=True)
    settings, generator = GenerationSettings(), torch.Generator().manual_seed(0)
    last = engine.speculate_step(ids, engine.drafters, settings, generator, limit=1)
    assert len(last.tree) == 1 and last.pure
    engine.verifier.crop(len(ids) - 1)
    step = engine.speculate_step(ids, engine.drafters, settings, generator, limit=3)
    assert 1 < len(step.tree) and max(step.tree.depths) <= 2
