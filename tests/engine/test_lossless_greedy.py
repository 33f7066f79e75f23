"""Greedy losslessness: speculative output is token-identical to transformers' generate.

The oracle is `generate(do_sample=False)` on the very verifier object the engine uses (the
embedded model, NF4). Speculators: the n-gram drafter, a near-perfect SSM (the verifier's own
unquantised weights, loaded as the engine loads an SSM: long acceptances), a deliberately bad SSM (a random tiny model with the
same vocabulary: rejections), one and two SSMs, several tree shapes, both merge policies (union
and vote; vote's speculators include the NF4 verifier itself, which agrees with its unquantised
weights on most but not all tokens, so vote really prunes).
"""

from __future__ import annotations

import pytest
import torch

from spectui.engine.chat import encode_chat
from spectui.engine.drafters import ModelDrafter, NGramDrafter
from spectui.engine.feature_drafter import FeatureDrafter
from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
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


def run(engine, ids, shape, speculate=True, merge="union", pipeline=False):
    settings = GenerationSettings(max_new_tokens=MAX_NEW, tree_shape=shape, speculate=speculate, merge=merge,
                                  detail=True, pipeline=pipeline)
    events = list(engine.generate(ids, settings))
    tokens = [t for e in events for t in e.new_tokens]
    return tokens, events[-1], events


def random_feature_drafter(nf4):
    """A FeatureHead with random weights (engine/feature_head.py) on the verifier's features: rejections."""
    torch.manual_seed(0)
    head = FeatureHead(FeatureHeadConfig.for_verifier(nf4.config, draft_vocab=512))
    head.vocab_ids.copy_(torch.arange(512))
    head.attach(nf4.get_input_embeddings().weight, nf4.get_output_embeddings().weight)
    return FeatureDrafter("feature", head.eval())


def two_ssms_and_ngram(ssm, bad, nf4):
    return [ModelDrafter("bad", bad), ModelDrafter("self", ssm), NGramDrafter()]


# name -> (speculators from (the near-perfect SSM, bad SSM, NF4 verifier), tree shape, merge policy)
CONFIGS = {
    "incremental": (lambda ssm, bad, nf4: [], (1,), "union"),
    "ngram": (lambda ssm, bad, nf4: [NGramDrafter()], (2, 2, 1, 1), "union"),
    "perfect-deep": (lambda ssm, bad, nf4: [ModelDrafter("self", ssm)], (1, 1, 1, 1, 1), "union"),
    "perfect-wide": (lambda ssm, bad, nf4: [ModelDrafter("self", ssm)], (3, 1), "union"),
    "bad": (lambda ssm, bad, nf4: [ModelDrafter("bad", bad)], (2, 2, 1, 1), "union"),
    "two-ssms+ngram": (two_ssms_and_ngram, (2, 1, 1), "union"),
    "vote:two-ssms+ngram": (two_ssms_and_ngram, (2, 1, 1), "vote"),
    "vote:perfect+verifier": (
        lambda ssm, bad, nf4: [ModelDrafter("self", ssm), ModelDrafter("nf4", nf4)], (2, 2, 1, 1), "vote"
    ),
    # the adaptive tree: shapes change every step, one-token (calibration) steps interleave
    "auto:two-ssms+ngram": (two_ssms_and_ngram, "auto", "union"),
    "auto:perfect+ngram": (lambda ssm, bad, nf4: [ModelDrafter("self", ssm), NGramDrafter()], "auto", "union"),
    "auto-vote:two-ssms+ngram": (two_ssms_and_ngram, "auto", "vote"),
    # a feature drafter (EAGLE): reads the verifier's hidden states, handed over after every pass
    "feature": (lambda ssm, bad, nf4: [random_feature_drafter(nf4)], (2, 2, 1), "union"),
    "auto:feature+ssm+ngram": (lambda ssm, bad, nf4: [random_feature_drafter(nf4), ModelDrafter("self", ssm), NGramDrafter()],
                               "auto", "union"),
    # pipelined drafting (engine/pipeline.py): the SSM drafts ahead while the verifier runs
    "pipe:perfect-deep": (lambda ssm, bad, nf4: [ModelDrafter("self", ssm)], (1, 1, 1, 1, 1), "union"),
    "pipe-auto:two-ssms+ngram": (two_ssms_and_ngram, "auto", "union"),
    "pipe-auto:feature+ssm+ngram": (lambda ssm, bad, nf4: [random_feature_drafter(nf4), ModelDrafter("bad", bad), NGramDrafter()],
                                    "auto", "union"),
}


def vote_counts_per_depth(event) -> dict[int, set[int]]:
    """Depth -> the set of vote counts (number of proposing speculators) among the tree's nodes."""
    counts: dict[int, set[int]] = {}
    for node in event.tree[1:]:
        counts.setdefault(node.depth, set()).add(len(node.sources))
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_speculative_equals_hf_generate(config, embedded_models, embedded_ssm, bad_ssm, references):
    make, shape, merge = CONFIGS[config]
    m = embedded_models
    engine = SpeculativeEngine(m.verifier, m.tokenizer, make(embedded_ssm, bad_ssm, m.verifier), m.stop_token_ids())
    stats, steps, per_draft = [], [], []
    for prompt in PROMPTS:
        ids, expected = references[prompt]
        tokens, last, events = run(engine, ids, shape, speculate=config != "incremental", merge=merge,
                                   pipeline=config.startswith("pipe"))
        assert tokens == expected, f"{config}: output differs from generate() for {prompt!r}"
        stats.append(last)
        steps += events[1:]
        drafting = [e for e in events[1:] if e.drafted]  # not the pure one-token steps (the speed-up's reference)
        per_draft.append(sum(len(e.new_tokens) for e in drafting) / max(1, len(drafting)))
    mean_accepted = sum(s.mean_accepted for s in stats) / len(stats)
    acceptance = sum(s.acceptance_rate for s in stats) / len(stats)
    tokens_per_draft = sum(per_draft) / len(per_draft)  # tokens committed per step that drafted
    if merge == "vote":  # the policy was applied: at every depth the survivors share one vote count
        assert all(len(c) == 1 for e in steps for c in vote_counts_per_depth(e).values())
    if config == "vote:perfect+verifier":
        # union holds the near-perfect SSM's 2+4+4+4 = 14 nodes at least; vote keeps only the agreed ones
        assert sum(e.drafted < 14 for e in steps) > len(steps) // 2, "vote should prune most trees"
        assert tokens_per_draft > 2.5, "pruning disagreements must keep the long acceptances"
    if config.startswith("auto"):
        assert all(e.speedup is not None for e in steps), "every step's speed-up is measured"
    if config == "two-ssms+ngram":  # union keeps minority nodes beside agreed ones
        assert any(len(c) > 1 for e in steps for c in vote_counts_per_depth(e).values())
    if config.startswith(("perfect", "pipe:perfect")):
        assert tokens_per_draft > 2.5, "a near-perfect SSM must give long acceptances"
    if config == "auto:perfect+ngram":  # the tree changes shape step to step, and speculation is accepted
        # (the unquantised SSM drafts slower than the NF4 verifier verifies, so auto uses it sparingly)
        assert len({e.drafted for e in steps}) >= 2 and sum(e.accepted_count for e in steps) > 0
    if config == "bad":
        assert acceptance < 0.2 and mean_accepted < 1.5, "a random SSM must mostly be rejected"
    if config == "incremental":
        assert mean_accepted == 1.0
