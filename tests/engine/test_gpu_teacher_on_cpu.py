"""scripts/gpu_teacher.py's parts, run on this CPU with tiny random models, so a lent GPU finds
working code: the dense copy of the 4-bit layers, batching by length, the right-padded feature
pass and its part files (engine/tune/features.save_features) feeding engine/tune/feature_train.py,
and the training loss on a device other than the CPU (the meta device stands in for CUDA: a tensor
made on the CPU inside the loss fails there as it would on a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
from spectui.engine.tune.data import Example
from spectui.engine.tune.features import save_features
from spectui.engine.tune.feature_train import (FeatureTrainConfig, batch_loss, load_parts, make_batch, train_head,
                                               windows)

TINY = (64, 128, 2, 4, 2)  # hidden, MLP, layers, heads, kv heads


@pytest.fixture
def teacher(monkeypatch):
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[2] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))
    import gpu_models
    import gpu_teacher

    monkeypatch.setitem(gpu_models.SHAPES, "tiny", TINY)
    return gpu_teacher, gpu_models


def test_dense_copy_holds_the_dequantized_weights(teacher):
    import bitsandbytes as bnb
    from bitsandbytes.functional import dequantize_4bit

    gpu_teacher, gpu_models = teacher
    model = gpu_models.to_nf4(gpu_models.random_llama("tiny", torch.float32, seed=0, device="cpu"), torch.float32)
    expected = {name: dequantize_4bit(m.weight.data, m.weight.quant_state).float()
                for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    x = torch.randint(3, 32000, (3, 9))
    before = copy.deepcopy(model)(x).logits  # a copy: bitsandbytes repacks a CPU layer's weight at its first forward
    assert gpu_teacher.dense_copy(model) == len(expected) == 2 * 7
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    for name, weight in expected.items():
        assert torch.equal(model.get_submodule(name).weight, weight), name
    after = model(x).logits  # bitsandbytes' CPU path may round the input to bf16: close, not equal
    assert (after - before).abs().max() <= 0.02 * before.abs().max()


def test_batches_by_length_keep_every_prompt_within_the_budget(teacher):
    gpu_teacher, _ = teacher
    rendered = [(f"p{i}", [1] * n) for i, n in enumerate([5, 40, 12, 33, 7, 7, 60, 2, 18])]
    batches = list(gpu_teacher.batches_by_length(rendered, max_answer=10, token_budget=120, max_batch=3))
    assert sorted(t for b in batches for t, _ in b) == sorted(t for t, _ in rendered)
    lengths = [len(ids) for b in batches for _, ids in b]
    assert lengths == sorted(lengths)
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or (max(len(ids) for _, ids in b) + 10) * len(b) <= 120


def test_padded_feature_pass_gives_each_sequence_its_own_features(teacher, tmp_path):
    gpu_teacher, gpu_models = teacher
    model = gpu_models.random_llama("tiny", torch.float32, seed=1, device="cpu")
    seqs = [[5, 9, 14, 200, 31, 7, 8], [11, 12, 13]]
    feats = gpu_teacher.features_of(model, seqs, pad=2)
    for seq, (hidden, top_ids, top_logp) in zip(seqs, feats):
        with torch.no_grad():
            alone = model.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
            logp = model.lm_head(alone).log_softmax(-1)
        assert hidden.shape == (len(seq), TINY[0]) and hidden.dtype == torch.bfloat16
        torch.testing.assert_close(hidden.float(), alone.to(torch.bfloat16).float(), atol=2e-2, rtol=2e-2)
        assert torch.equal(top_ids[:, 0].long(), logp.argmax(-1))
        torch.testing.assert_close(top_logp[:, 0].float(), logp.max(-1).values, atol=1e-2, rtol=1e-2)

    examples = [Example("a", seqs[0][:4], seqs[0][4:], "greedy", False), Example("b", seqs[1][:2], seqs[1][2:], "sample", True)]
    path = tmp_path / "features" / "part-w00-00000.safetensors"
    assert save_features(path, examples, feats) == len(seqs[0]) + len(seqs[1])
    parts = load_parts(tmp_path / "features")
    assert parts[0]["starts"].tolist() == [0, 7, 10] and parts[0]["answer_starts"].tolist() == [4, 9]
    assert parts[0]["ids"].tolist() == seqs[0] + seqs[1]

    config = FeatureHeadConfig.for_verifier(model.config, draft_vocab=64)
    head = FeatureHead(config)
    head.vocab_ids.copy_(torch.sort(torch.unique(torch.cat([parts[0]["top_ids"][:, 0].long(), torch.arange(64)]))[:64]).values)
    head.attach(model.model.embed_tokens.weight, model.lm_head.weight, torch.float32)
    stats = train_head(head.train(), parts, FeatureTrainConfig(window=4, batch_windows=2, epochs=2, warmup=1),
                       log=lambda s: None, device=torch.device("cpu"))
    batches = -(-len(windows(parts, 4)) // 2)
    assert stats["steps"] == 2 * batches and stats["final_loss"] == stats["final_loss"]  # two epochs, loss not NaN


def test_head_to_train_loads_widens_or_starts_fresh(teacher, tmp_path):
    gpu_teacher, gpu_models = teacher
    config = FeatureHeadConfig.for_verifier(gpu_models.llama_config("tiny"), draft_vocab=32)
    torch.manual_seed(3)
    saved = FeatureHead(config)
    saved.vocab_ids.copy_(torch.randperm(100)[:32])
    saved.save(tmp_path / "init")
    init = FeatureHead.load(tmp_path / "init")
    H = config.hidden

    same = gpu_teacher.head_to_train(tmp_path / "init", scratch=False, prev_token=False)
    assert same.training and not same.config.prev_token
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), init.state_dict().values()))

    wider = gpu_teacher.head_to_train(tmp_path / "init", scratch=False, prev_token=True)
    assert wider.config.prev_token and wider.fc.weight.shape == (H, 3 * H)
    assert torch.equal(wider.fc.weight[:, : 2 * H], init.fc.weight) and not wider.fc.weight[:, 2 * H :].any()

    fresh = [gpu_teacher.head_to_train(tmp_path / "init", scratch=True, prev_token=True, seed=s) for s in (0, 0, 1)]
    for head in fresh:
        assert head.config.prev_token and head.fc.weight.shape == (H, 3 * H)
        assert torch.equal(head.vocab_ids, init.vocab_ids)  # the init's draft vocabulary, fresh weights
        assert not torch.equal(head.qkv.weight, init.qkv.weight)
    assert torch.equal(fresh[0].qkv.weight, fresh[1].qkv.weight) and not torch.equal(fresh[0].qkv.weight, fresh[2].qkv.weight)
    plain = gpu_teacher.head_to_train(tmp_path / "init", scratch=True, prev_token=False)
    assert not plain.config.prev_token and plain.fc.weight.shape == (H, 2 * H)


@pytest.mark.parametrize("prev_token", [False, True])
def test_feature_loss_runs_on_another_device(teacher, prev_token):
    _, gpu_models = teacher
    config = FeatureHeadConfig.for_verifier(gpu_models.llama_config("tiny"), draft_vocab=32)
    config.prev_token = prev_token
    head = FeatureHead(config)
    head.vocab_ids.copy_(torch.arange(32))
    embed = torch.randn(100, config.hidden)
    parts = [{"hidden": torch.randn(12, config.hidden).to(torch.bfloat16), "ids": torch.randint(0, 100, (12,), dtype=torch.int32),
              "top_ids": torch.randint(0, 40, (12, 4), dtype=torch.int32), "top_logp": torch.randn(12, 4).to(torch.float16),
              "starts": torch.tensor([0, 12]), "answer_starts": torch.tensor([5])}]
    vocab_map = torch.full((100,), -1, dtype=torch.long)
    vocab_map[:32] = torch.arange(32)
    head = head.to("meta")
    head.attach(embed.to("meta"), embed.to("meta"), torch.float32)
    batch = tuple(t.to("meta") for t in make_batch(parts, windows(parts, 8)[:1], vocab_map, 0.5))
    loss, hit, hit2, _ = batch_loss(head.train(), batch, FeatureTrainConfig())
    loss.backward()  # forward and backward built no CPU tensor on the way
    assert loss.device.type == hit.device.type == hit2.device.type == "meta"
    assert head.fc.weight.grad is not None
