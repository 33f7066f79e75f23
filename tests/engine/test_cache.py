"""The verifier's tree forward and KV bookkeeping, on a tiny random model.

- A tree forward gives every node the logits of a plain forward over its root-to-node chain.
- After N speculative steps, the verifier cache equals a plain forward over the committed tokens
  (all but the newest, which is the next tree's root).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectui.engine.cached_model import CachedModel
from spectui.engine.drafters import ModelDrafter, NGramDrafter
from spectui.engine.lean_model import LeanModel
from spectui.engine.loading import load_causal_lm
from spectui.engine.settings import GenerationSettings
from spectui.engine.speculative import SpeculativeEngine
from spectui.engine.tree import TokenTree


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
    return load_causal_lm(tiny_dirs["verifier"], "cpu", "none")


@st.composite
def trees(draw):
    tree = TokenTree.with_root(draw(st.integers(0, 40000)))
    for _ in range(draw(st.integers(0, 20))):
        tree.add(draw(st.integers(0, len(tree) - 1)), draw(st.integers(0, 40000)), 0, 0.5)
    return tree


@pytest.mark.parametrize("runner_class", [CachedModel, LeanModel])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees(), prefix=st.lists(st.integers(0, 40000), min_size=1, max_size=12))
def test_tree_forward_equals_chain_forwards(tiny, tree, prefix, runner_class):
    runner = runner_class(tiny)
    runner.forward_chain(prefix)
    tree_logits = runner.forward_tree(tree)  # [N, V]
    assert runner.length == len(prefix) + len(tree)
    for node in range(len(tree)):
        chain = [tree.tokens[0]] + [tree.tokens[i] for i in tree.path_to(node)]
        fresh = CachedModel(tiny)
        expected = fresh.forward_chain(prefix + chain)[-1]
        torch.testing.assert_close(tree_logits[node], expected, rtol=1e-4, atol=1e-4)


def assert_cache_matches(engine, tiny, tokens):
    """The engine's verifier cache holds `tokens`' key/values: a chain fed after it gets the logits
    of a plain forward over tokens + chain in every position (each reads every layer's cache)."""
    assert engine.verifier.length == len(tokens)
    probe = [11, 12, 13]
    ours = engine.verifier.forward_chain(probe)  # [3, V]
    engine.verifier.crop(len(tokens))
    expected = CachedModel(tiny).forward_chain(tokens + probe)[-len(probe):]
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_cache_after_steps_equals_plain_forward(tiny, tiny_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["verifier"])
    ssm = load_causal_lm(tiny_dirs["ssm68"], "cpu", "none")
    engine = SpeculativeEngine(tiny, tokenizer, [ModelDrafter("self", tiny), ModelDrafter("other", ssm), NGramDrafter()])
    prompt = tokenizer("the cat sat on the mat and the cat sat", add_special_tokens=False)["input_ids"]
    committed = list(prompt)
    multi_token_steps = 0
    for event in engine.generate(prompt, GenerationSettings(max_new_tokens=30, tree_shape=(2, 1, 1))):
        committed += event.new_tokens
        multi_token_steps += event.accepted_count >= 2
        if event.step in (3, 6) or event.finished:
            # invariant: the cache holds every committed token but the newest (the next root)
            assert_cache_matches(engine, tiny, committed[:-1])
    assert multi_token_steps >= 1  # real multi-token steps happened


def test_drafter_cache_tracks_committed_tokens(tiny):
    drafter = ModelDrafter("self", tiny)
    committed = [5, 6, 7, 8]
    tree = TokenTree.with_root(8)
    drafter.draft(committed, tree, 0, (2, 2))
    assert drafter.runner.length == len(committed)  # tree nodes cropped away
    assert len(tree) == 1 + 2 + 4
    assert all(tree.depths[i] == 1 for i in tree.children(0))
