"""LeanModel (engine/lean_model.py) gives CachedModel's logits bit for bit, on every kind of pass.

CachedModel runs transformers' forward; LeanModel the same arithmetic without transformers'
machinery, with fused 4-bit calls and its own cache (float32 where the exact kernel runs). Both feed one sequence of passes a decode
loop makes: a prefill, one-token steps, a tree, compaction of an accepted path, a tree fed in two
parts (how drafters grow theirs), a rewind to a shared prefix.
"""

from __future__ import annotations

import pytest
import torch

from spectui.engine.cached_model import CachedModel
from spectui.engine.lean_model import ENV_VAR, MIN_CAPACITY, LeanModel, runner_for, supports
from spectui.engine.loading import load_causal_lm, load_models
from spectui.engine.presets import resolve_model
from spectui.engine.tree import TokenTree
from spectui.kernels.hf_attention import register_tree_attention


def same_passes(model, prompt: list[int], argmax_only: bool = False) -> int:
    """Run both runners through one decode loop's passes; assert equal logits (equal argmaxes where
    LeanModel runs `argmax_only`: kernels/argmax_head.py); return passes checked."""
    ref, lean = CachedModel(model), LeanModel(model)
    lean.argmax_only = argmax_only
    checked = 0

    def both(call):
        nonlocal checked
        a, b = call(ref), call(lean)
        if argmax_only:
            assert a.shape == b.shape and torch.equal(a.argmax(-1), b.argmax(-1)), f"pass {checked}"
        else:
            assert a.shape == b.shape and torch.equal(a, b), f"pass {checked}: max diff {(a - b).abs().max()}"
        assert ref.length == lean.length
        checked += 1
        return a

    logits = both(lambda r: r.forward_chain(prompt))  # [P, V]
    token = int(logits[-1].argmax())
    for _ in range(3):
        token = int(both(lambda r: r.forward_chain([token], last_only=True))[-1].argmax())
    tree = TokenTree.with_root(token)
    tree.add_path(prompt[2:7], 0)
    tree.add_path(prompt[2:4] + prompt[9:11], 0)  # a second branch below node 2
    both(lambda r: r.forward_tree(tree))
    base = ref.length - len(tree)
    path = [base + i for i in (0, 1, 2, 6, 7)]  # root, two shared nodes, then the second branch
    for r in (ref, lean):
        r.keep(list(range(base)) + path)
    both(lambda r: r.forward_chain(prompt[20:23]))
    grown = TokenTree.with_root(prompt[0])
    grown.add_path(prompt[1:4], 0)
    both(lambda r: r.forward_tree(grown, [0, 1]))
    both(lambda r: r.forward_tree(grown, [2, 3]))  # the rest, nodes 0-1 already in the cache
    for r in (ref, lean):
        r.crop(len(prompt) + 4)
    kept = {r.rewind(prompt + [5, 6], prompt[:30] + [7]) for r in (ref, lean)}
    assert kept == {30}
    both(lambda r: r.forward_chain([7, 8], last_only=True))
    return checked


def test_a_chain_tree_scores_as_a_causal_pass_bit_for_bit(embedded_models):
    """The engine verifies a chain of drafts through forward_chain (SpeculativeEngine.score_tree):
    every row's logits are the tree pass's, bit for bit, at every chain length."""
    m = embedded_models
    lean = LeanModel(m.verifier)
    prompt = m.tokenizer.encode("Rivers carve their valleys slowly, one flood at a time. " * 8)[:90]
    lean.forward_chain(prompt[:-1], last_only=True)
    base = lean.length
    for size in (2, 3, 5):
        tree = TokenTree.with_root(prompt[-1])
        tree.add_path(prompt[10 : 9 + size], 0)
        assert tree.is_chain
        as_tree = lean.forward_tree(tree)  # [size, V]
        lean.crop(base)
        as_chain = lean.forward_chain(tree.tokens)  # [size, V]
        lean.crop(base)
        assert as_tree.shape == as_chain.shape == (size, as_tree.shape[1])
        assert torch.equal(as_tree, as_chain), f"size {size}: max diff {(as_tree - as_chain).abs().max()}"


def test_lean_passes_match_transformers_on_the_embedded_verifier(embedded_models):
    m = embedded_models
    assert supports(m.verifier)
    prompt = m.tokenizer.encode("The tide rises at dawn and the boats leave the harbour one by one. " * 12)[:160]
    assert same_passes(m.verifier, prompt) == 9


def test_argmax_only_passes_pick_the_same_tokens_on_the_embedded_verifier(embedded_models):
    """The bf16 screen (greedy decoding without display) argmaxes like transformers' fp32 head."""
    m = embedded_models
    prompt = m.tokenizer.encode("Rain fell on the old stone bridge while the market opened slowly. " * 12)[:160]
    assert same_passes(m.verifier, prompt, argmax_only=True) == 9


@pytest.mark.parametrize("quant", ["nf4", "none"])
def test_lean_passes_match_transformers_on_a_tiny_random_llama(tiny_dirs, quant):
    attn = register_tree_attention("exact")
    model = load_causal_lm(tiny_dirs["verifier"], "cpu", quant, attn)
    assert supports(model)
    torch.manual_seed(0)
    assert same_passes(model, torch.randint(5, 2000, (40,)).tolist()) == 9


def test_the_cache_keeps_its_memory_across_sequences_and_room_beyond_a_prompt(tiny_dirs):
    """A fresh cache sized to its prompt was copied to a larger one at the first step after the prefill
    (8-15 ms after a 600-token prompt here), and faulted in page by page at every prefill. Now the
    first growth leaves MIN_CAPACITY positions free and reset() keeps the memory: what a stale buffer
    holds past the new sequence is never read."""
    model = load_causal_lm(tiny_dirs["verifier"], "cpu", "nf4", register_tree_attention("exact"))
    torch.manual_seed(1)
    long, short = torch.randint(5, 2000, (300,)).tolist(), torch.randint(5, 2000, (40,)).tolist()
    lean = LeanModel(model)
    lean.forward_chain(long)
    buffer = lean.kv
    assert buffer.shape[4] >= len(long) + MIN_CAPACITY
    for token in long[:5]:
        lean.forward_chain([token], last_only=True)
    assert lean.kv is buffer  # the steps after the prefill wrote into it, no copy
    lean.reset()
    again = lean.forward_chain(short)
    assert lean.kv is buffer and lean.length == len(short)
    assert torch.equal(again, LeanModel(model).forward_chain(short))
    lean.prefill_left_padded([short, long[:50]])  # a batch of two replaces it; one sequence again after
    assert lean.kv.shape[2] == 2
    with pytest.raises(ValueError):
        lean.forward_chain([7])  # the batch holds two sequences
    lean.reset()
    assert torch.equal(lean.forward_chain(short), again) and lean.kv.shape[2] == 1


def test_the_runner_is_chosen_by_what_the_model_is(tiny_dirs, tmp_path, embedded_dir, monkeypatch):
    from tiny_models import save_tiny_llama

    exact = load_causal_lm(tiny_dirs["verifier"], "cpu", "nf4", register_tree_attention("exact"))
    assert isinstance(runner_for(exact), LeanModel)
    monkeypatch.setenv(ENV_VAR, "transformers")
    assert isinstance(runner_for(exact), CachedModel)
    monkeypatch.delenv(ENV_VAR)
    ssm = load_causal_lm(tiny_dirs["ssm68"], "cpu", "none", dtype=torch.bfloat16)  # SDPA in bf16: how SSMs draft
    assert isinstance(runner_for(ssm), LeanModel)
    eager = load_causal_lm(tiny_dirs["ssm68"], "cpu", "none", attn="eager")
    biased = load_causal_lm(save_tiny_llama(tmp_path / "biased", embedded_dir, seed=5, attention_bias=True), "cpu", "none")
    for other in (eager, biased):  # what LeanModel does not reproduce keeps transformers' forward
        assert not supports(other) and isinstance(runner_for(other), CachedModel)


def test_an_ssm_drafts_the_same_tokens_through_either_runner(tiny_dirs):
    ssm = load_causal_lm(tiny_dirs["ssm68"], "cpu", "none", dtype=torch.bfloat16)
    ref, lean = CachedModel(ssm), LeanModel(ssm)
    prompt = list(range(300, 340))
    a, b = ref.forward_chain(prompt), lean.forward_chain(prompt)
    torch.testing.assert_close(a, b, rtol=0.02, atol=0.05)  # bf16 SDPA; stacked projections round differently
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
    tree = TokenTree.with_root(7)
    tree.add_path([8, 9, 10], 0)
    tree.add_path([8, 11], 0)
    torch.testing.assert_close(ref.forward_tree(tree), lean.forward_tree(tree), rtol=0.02, atol=0.05)


def test_the_engine_verifies_with_the_lean_runner(tiny_dirs):
    from spectui.engine.loading import build_engine

    models = load_models(resolve_model(str(tiny_dirs["verifier"])), quant="nf4", device="cpu")
    engine = build_engine(models, ngram=True)
    assert isinstance(engine.verifier, LeanModel)
