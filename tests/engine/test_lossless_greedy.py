"""Greedy losslessness: speculative output is token-identical to transformers' generate.

The oracle is `generate(do_sample=False)` on the very verifier object the engine uses (the
embedded model, NF4). Speculators: the n-gram drafter, a near-perfect SSM (the verifier's own
unquantised weights: long acceptances), a deliberately bad SSM (a random tiny model with the
same vocabulary: rejections), one and two SSMs, several tree shapes.
"""

from __future__ import annotations

import pytest
import torch

from spectui.engine.chat import encode_chat
from spectui.engine.drafters import ModelDrafter, NGramDrafter
from spectui.engine.loading import load_causal_lm
from spectui.engine.settings import GenerationSettings
from spectui.engine.speculative import SpeculativeEngine

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "How can I improve my time management skills?",
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def bad_ssm(tiny_dirs):
    return load_causal_lm(tiny_dirs["ssm68"], "cpu", "none")


@pytest.fixture(scope="module")
def references(embedded_models):
    """Token ids from transformers' own greedy generate, per prompt."""
    m = embedded_models
    out = {}
    for prompt in PROMPTS:
        ids = encode_chat(m.tokenizer, [{"role": "user", "content": prompt}])
        x = torch.tensor([ids])
        with torch.inference_mode():
            gen = m.verifier.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False,
                eos_token_id=m.stop_token_ids(), pad_token_id=m.stop_token_ids()[0],
            )
        out[prompt] = (ids, gen[0, len(ids):].tolist())
    return out


def run(engine, ids, shape, speculate=True):
    settings = GenerationSettings(max_new_tokens=MAX_NEW, tree_shape=shape, speculate=speculate)
    events = list(engine.generate(ids, settings))
    tokens = [t for e in events for t in e.new_tokens]
    return tokens, events[-1]


CONFIGS = {
    "incremental": (lambda fp32, bad: [], (1,)),
    "ngram": (lambda fp32, bad: [NGramDrafter()], (2, 2, 1, 1)),
    "perfect-deep": (lambda fp32, bad: [ModelDrafter("self", fp32)], (1, 1, 1, 1, 1)),
    "perfect-wide": (lambda fp32, bad: [ModelDrafter("self", fp32)], (3, 1)),
    "bad": (lambda fp32, bad: [ModelDrafter("bad", bad)], (2, 2, 1, 1)),
    "two-ssms+ngram": (lambda fp32, bad: [ModelDrafter("bad", bad), ModelDrafter("self", fp32), NGramDrafter()], (2, 1, 1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_speculative_equals_hf_generate(config, embedded_models, embedded_fp32, bad_ssm, references):
    make, shape = CONFIGS[config]
    m = embedded_models
    engine = SpeculativeEngine(m.verifier, m.tokenizer, make(embedded_fp32, bad_ssm), m.stop_token_ids())
    stats = []
    for prompt in PROMPTS:
        ids, expected = references[prompt]
        tokens, last = run(engine, ids, shape, speculate=config != "incremental")
        assert tokens == expected, f"{config}: output differs from generate() for {prompt!r}"
        stats.append(last)
    mean_accepted = sum(s.mean_accepted for s in stats) / len(stats)
    acceptance = sum(s.acceptance_rate for s in stats) / len(stats)
    if config.startswith("perfect"):
        assert mean_accepted > 2.5, "a near-perfect SSM must give long acceptances"
    if config == "bad":
        assert acceptance < 0.2 and mean_accepted < 1.5, "a random SSM must mostly be rejected"
    if config == "incremental":
        assert mean_accepted == 1.0
