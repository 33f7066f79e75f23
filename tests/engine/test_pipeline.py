"""Pipelined drafting (engine/pipeline.py): the SSM's work for the next step, done while the verifier runs.

Tiny random LLaMA models built in memory; the SSM's cache and logits are compared with a fresh
drafter fed the same tokens the ordinary way.
"""

from __future__ import annotations

import pytest
import torch

from spectui.engine.calibrate import measure_costs
from spectui.engine.drafters import ModelDrafter, NGramDrafter
from spectui.engine.pipeline import likely_path, start_prefetch
from spectui.engine.settings import GenerationSettings
from spectui.engine.speculative import SpeculativeEngine
from spectui.engine.tree import TokenTree


def tiny_llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # peaked next-token distributions, like a trained LM
    return model


class Counting:
    """Counts the forwards a drafter's runner makes (the drafter itself runs unchanged)."""

    def __init__(self, drafter: ModelDrafter) -> None:
        self.calls = 0
        real = drafter.runner.forward_chain

        def forward_chain(tokens, last_only=False):
            self.calls += 1
            return real(tokens, last_only)

        drafter.runner.forward_chain = forward_chain


COMMITTED = [5, 17, 33, 8, 41, 9]


def test_likely_path_follows_the_most_probable_child():
    tree = TokenTree.with_root(7)
    a = tree.add(0, 10, 0, 0.6)
    tree.add(0, 11, 0, 0.3)
    tree.add(a, 12, 0, 0.2)
    b = tree.add(a, 13, 0, 0.7)
    tree.add(b, 14, 0, 0.9)
    assert likely_path(tree) == [10, 13, 14]
    assert likely_path(TokenTree.with_root(7)) == []


def test_a_right_guess_serves_the_next_root_without_a_forward():
    model = tiny_llama(0)
    piped, plain = ModelDrafter("s", model), ModelDrafter("s", model)
    piped.catch_up(COMMITTED)
    piped.prefetch(COMMITTED, [20, 21])
    fed = piped.ids
    assert fed[: len(COMMITTED) + 2] == COMMITTED + [20, 21] and len(fed) == len(COMMITTED) + 3
    counter = Counting(piped)
    got = piped.catch_up(fed)
    assert counter.calls == 0
    want = plain.catch_up(fed)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert piped.runner.length == len(fed) and piped.ready is None


def test_a_wrong_guess_keeps_the_shared_prefix_and_feeds_the_rest():
    model = tiny_llama(1)
    piped, plain = ModelDrafter("s", model), ModelDrafter("s", model)
    piped.catch_up(COMMITTED)
    piped.prefetch(COMMITTED, [20, 21, 22])
    actual = COMMITTED + [20, 50]  # the verifier accepted one token and chose another bonus
    counter = Counting(piped)
    got = piped.catch_up(actual)
    assert counter.calls == 1 and piped.runner.length == len(actual) and piped.ids == actual
    torch.testing.assert_close(got, plain.catch_up(actual), rtol=1e-4, atol=1e-4)


def test_start_prefetch_runs_only_for_an_ssm_that_drafted():
    model = tiny_llama(2)
    ssm, ngram = ModelDrafter("s", model), NGramDrafter()
    tree = TokenTree.with_root(COMMITTED[-1])
    tree.add(0, 20, 0, 0.9)
    assert start_prefetch(tree, COMMITTED, [ngram, ssm], ran=[]) is None
    assert start_prefetch(TokenTree.with_root(9), COMMITTED, [ssm], ran=["s"]) is None
    prefetch = start_prefetch(tree, COMMITTED, [ngram, ssm], ran=["s"])
    prefetch.join()
    assert ssm.ids[: len(COMMITTED) + 1] == COMMITTED + [20] and ssm.ready is not None


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 2, 1), "auto"])
def test_pipelined_output_equals_unpipelined(shape):
    verifier, ssm = tiny_llama(3), tiny_llama(3)  # the SSM is the verifier's twin: long acceptances

    class Tok:  # ids only: this test never shows text
        def decode(self, ids, **kw):
            return "".join(chr(65 + i % 26) for i in ids)

        def convert_ids_to_tokens(self, ids):
            return [chr(65 + i % 26) for i in ids]

    outputs = []
    for pipeline in (False, True):
        drafter = ModelDrafter("s", ssm)
        engine = SpeculativeEngine(verifier, Tok(), [drafter], [2])
        engine.cost_model = measure_costs(engine, grid=(1, 2, 4, 8), repeats=1, prefix=list(range(3, 43)))
        settings = GenerationSettings(max_new_tokens=40, tree_shape=shape, pipeline=pipeline)
        events = list(engine.generate(COMMITTED, settings))
        outputs.append([t for e in events for t in e.new_tokens])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 40
    assert drafter.hits <= drafter.prefetches
    if shape != "auto":  # whether the auto tree runs the SSM at all depends on measured costs
        assert drafter.prefetches > 0 and drafter.hits > 0, "the pipeline ran, and a right guess served a root"
