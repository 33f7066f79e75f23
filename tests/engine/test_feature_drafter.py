"""FeatureDrafter: its cached, tree-shaped drafting computes what the head computes on plain chains.

A random FeatureHead over random features and tokens (no verifier needed): the root's predicted
feature after catch-up, and a drafted node's, must equal the head's own causal forward over the
equivalent chain (the drafted node fed with its parent's predicted feature); a drafter that caught
up step by step (features arriving after each step, drafted slots dropped) must hold the same cache
as a fresh one. Saving and loading keep the head's outputs. Each for a head that reads the token
before each input too (prev_token): the drafter hands it the committed or parent token.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spectui.engine import feature_drafter
from spectui.engine.feature_drafter import FeatureDrafter
from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig, is_feature_head
from spectui.engine.tree import TokenTree

V, H = 1000, 64
CONFIG = FeatureHeadConfig(hidden=H, heads=4, kv_heads=2, head_dim=16, intermediate=128, rope_theta=10_000.0,
                           draft_vocab=300)


@pytest.fixture(params=[False, True], ids=["plain", "prev_token"])
def head(request):
    torch.manual_seed(0)
    head = FeatureHead(replace(CONFIG, prev_token=request.param))
    head.vocab_ids.copy_(torch.randperm(V)[: CONFIG.draft_vocab].sort().values)
    head.attach(torch.randn(V, H), torch.randn(V, H) * 3)
    return head.eval()


def chain_features(head, tokens, prev, x0: int = 0):
    """The head's causal forward over positions 1 .. len(tokens): inputs x_p, prev[p - 1] (and x_{p-1}, x0
    before the first) -> f^ [T, H]."""
    positions = torch.arange(1, len(tokens) + 1)[None]
    with torch.no_grad():
        out, _ = head(torch.tensor([tokens]), prev[None], positions, before=torch.tensor([[x0, *tokens[:-1]]]))
    return out[0]


def primed(head, seed: int, tokens: int, positions: int, known: int):
    """(committed: `tokens` random ids, feats [positions, H] random, a FeatureDrafter given feats[:known])."""
    torch.manual_seed(seed)
    committed = torch.randint(0, V, (tokens,)).tolist()
    feats = torch.randn(positions, H)
    drafter = FeatureDrafter("a", head)
    drafter.take_features(0, feats[:known])
    return committed, feats, drafter


def test_root_and_drafted_node_match_the_causal_forward(head):
    # x_0 .. x_19 (x_19 the root), f_0 .. f_18
    committed, feats, drafter = primed(head, seed=1, tokens=20, positions=19, known=19)
    tree = TokenTree.with_root(committed[-1])
    children = drafter.begin(committed, tree, 0, 2)
    reference = chain_features(head, committed[1:], feats, committed[0])  # positions 1 .. 19
    assert torch.allclose(drafter.own_feature[0], reference[-1], atol=1e-5)
    grandchildren = drafter.expand(tree, 0, children, 2)
    for child in children:  # fed as (its token, the root's f^) at position 20
        chained = chain_features(head, committed[1:] + [tree.tokens[child]], torch.cat([feats, reference[-1:]]), committed[0])
        assert torch.allclose(drafter.own_feature[child], chained[-1], atol=1e-5)
    assert len(grandchildren) == 4 and all(tree.depths[g] == 2 for g in grandchildren)
    # the top-1 child is the draft vocabulary's argmax of the root's f^
    best = int(head.vocab_ids[head.draft_logits(reference[-1]).argmax()])
    assert tree.tokens[children[0]] == best
    drafter.finish()
    assert drafter.used == drafter.fed == 19


def test_step_by_step_cache_equals_a_fresh_one(head):
    committed, feats, stepped = primed(head, seed=2, tokens=12, positions=40, known=11)
    for extra in ([5, 6], [7], [8, 9, 10]):  # a step accepts some tokens, then the verifier's features arrive
        tree = TokenTree.with_root(committed[-1])
        stepped.expand(tree, 0, stepped.begin(committed, tree, 0, 3), 1)
        stepped.finish()
        first = len(committed) - 1  # the root's position: features for root + accepted nodes
        committed = committed + extra
        stepped.take_features(first, feats[first : len(committed) - 1])
    fresh = FeatureDrafter("b", head)
    fresh.take_features(0, feats[: len(committed) - 1])
    assert torch.allclose(stepped.catch_up(committed), fresh.catch_up(committed), atol=1e-5)
    assert torch.allclose(stepped.kv[:, :, :, : stepped.fed], fresh.kv[:, :, :, : fresh.fed], atol=1e-5)


def test_rewind_keeps_the_shared_prefix(head):
    committed, feats, drafter = primed(head, seed=3, tokens=15, positions=30, known=14)
    drafter.catch_up(committed)
    new_prompt = committed[:9] + [1, 2, 3]
    drafter.rewind(new_prompt)
    assert drafter.known == 9 and drafter.fed == 8
    drafter.take_features(9, feats[9:11])  # the new turn's prefill gives positions 9 .. 10
    fresh = FeatureDrafter("b", head)
    fresh.take_features(0, torch.cat([feats[:9], feats[9:11]]))
    assert torch.allclose(drafter.catch_up(new_prompt), fresh.catch_up(new_prompt), atol=1e-5)


def test_a_fresh_cache_is_fed_the_last_window_of_a_long_prompt(head, monkeypatch):
    monkeypatch.setattr(feature_drafter, "CATCH_UP_WINDOW", 8)
    committed, feats, drafter = primed(head, seed=5, tokens=21, positions=40, known=20)
    root = drafter.catch_up(committed)  # n = 20: positions 13 .. 20 fed, slots 0 .. 7
    assert (drafter.offset, drafter.fed, drafter.fed_last) == (12, 8, 8)
    with torch.no_grad():  # the head's causal forward over positions 13 .. 20 alone
        out, _ = head(torch.tensor([committed[13:21]]), feats[None, 12:20], torch.arange(13, 21)[None],
                      before=torch.tensor([committed[12:20]]))
    assert torch.allclose(root, out[0, -1], atol=1e-5)
    # a drafted node sees the window's slots and the root's f^, at position 21
    tree = TokenTree.with_root(committed[-1])
    child = drafter.begin(committed, tree, 0, 2)[0]
    drafter.expand(tree, 0, [child], 1)
    with torch.no_grad():
        out, _ = head(torch.tensor([committed[13:21] + [tree.tokens[child]]]),
                      torch.cat([feats[12:20], root[None]])[None], torch.arange(13, 22)[None],
                      before=torch.tensor([committed[12:21]]))
    assert torch.allclose(drafter.own_feature[child], out[0, -1], atol=1e-5)
    drafter.finish()
    # the next step extends the window; features that change before it empty the cache
    committed = committed + [7, 8]
    drafter.take_features(20, feats[20:22])
    drafter.catch_up(committed)
    assert (drafter.offset, drafter.fed, drafter.fed_last) == (12, 10, 2)  # positions 21, 22
    drafter.take_features(10, feats[10:22])  # positions from 10 on changed: every slot reads one of them
    assert (drafter.offset, drafter.fed) == (0, 0)
    drafter.rewind(committed[:30])
    drafter.catch_up(committed)
    assert (drafter.offset, drafter.fed) == (14, 8)


def test_save_and_load_keep_the_outputs(head, tmp_path):
    head.save(tmp_path / "fh", {"note": "test"})
    assert is_feature_head(tmp_path / "fh") and not is_feature_head(tmp_path)
    loaded = FeatureHead.load(tmp_path / "fh")
    assert loaded.config == head.config
    loaded.attach(head.embed, torch.zeros(V, H).index_copy_(0, head.vocab_ids, head.draft_rows))
    assert torch.equal(loaded.vocab_ids, head.vocab_ids)
    tokens, prev = torch.randint(0, V, (6,)).tolist(), torch.randn(6, H)
    # bf16 on disk: equal to the bf16-rounded head's outputs, close to the original's
    assert torch.allclose(chain_features(loaded, tokens, prev), chain_features(head, tokens, prev), atol=0.1)


@pytest.mark.parametrize("window,prev_token", [(None, False), (8, False), (None, True)])
def test_tune_eval_predictions_are_the_drafters_first_level(embedded_models, monkeypatch, window, prev_token):
    """`spectui tune-eval` measures a feature head teacher-forced (engine/tune/evaluate.py): its top-k at
    each answer position must be the children the FeatureDrafter hangs under the root there, with the
    features the engine hands it (the verifier's, from its own passes); with a window shorter than the
    prompt too (the drafter first runs at the answer's start, as tune-eval assumes)."""
    if window is not None:
        monkeypatch.setattr(feature_drafter, "CATCH_UP_WINDOW", window)
    from spectui.engine.lean_model import LeanModel
    from spectui.engine.tune.evaluate import predict_topk
    from spectui.engine.tune.train import Sequence

    verifier = embedded_models.verifier
    torch.manual_seed(4)
    head = FeatureHead(replace(FeatureHeadConfig.for_verifier(verifier.config, draft_vocab=512), prev_token=prev_token))
    head.vocab_ids.copy_(torch.arange(512))
    head.attach(verifier.get_input_embeddings().weight, verifier.get_output_embeddings().weight, verifier=verifier)
    head.eval()
    ids = torch.randint(0, 512, (24,)).tolist()
    seq = Sequence(ids, start=15, mode="greedy")
    (top,) = predict_topk(head, [seq], k=3)
    assert top.shape == (len(seq.targets), 3)
    runner = LeanModel(verifier)
    runner.keep_hidden = True
    drafter, known = FeatureDrafter("feature", head), 0
    for t in (15, 19, 22):  # the head's guesses for ids[t + 1], made at position t
        runner.reset()
        runner.forward_chain(ids[:t], last_only=True)  # the verifier's features f_0 .. f_{t-1}
        drafter.take_features(known, runner.hidden[0][known:])  # as the engine hands them over, step by step
        known = t
        tree = TokenTree.with_root(ids[t])
        children = drafter.begin(ids[: t + 1], tree, 0, 3)
        drafter.finish()
        assert drafter.offset == (0 if window is None else 15 - window)
        assert [tree.tokens[c] for c in children] == top[t - seq.start].tolist()


def test_with_prev_token_keeps_the_outputs_until_trained(head):
    if head.config.prev_token:
        assert head.with_prev_token() is head
        return
    wider = head.with_prev_token()
    assert wider.config.prev_token and wider.fc.weight.shape == (H, 3 * H)
    tokens, prev = torch.randint(0, V, (6,)).tolist(), torch.randn(6, H)
    # the same function: zero columns for the previous token (to fp32 rounding: on AVX-512 CPUs torch's
    # product of 3 H columns sums in another order than that of 2 H)
    torch.testing.assert_close(chain_features(wider, tokens, prev, 5), chain_features(head, tokens, prev, 5),
                               rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        wider.fc.weight[:, 2 * H :].normal_()  # once trained, the token before each input counts
    assert not torch.allclose(chain_features(wider, tokens, prev, 5), chain_features(wider, tokens, prev, 6))
