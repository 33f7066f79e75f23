"""Training checkpoints (engine/tune/train.py) load with torch.load(weights_only=True).

A checkpoint is unpickled on --resume; with weights_only=False a crafted checkpoint.pt could run
any code. Resume with a real tiny LLaMA, trained for real: the checkpoint holds only tensors and
plain types, a resumed run ends on the very weights of an uninterrupted one, and a checkpoint
holding anything else is refused without running it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spectui.engine.tune.config import TuneConfig
from spectui.engine.tune.train import Sequence, checkpoint_path, train_ssm

SEQS = [Sequence([1, 5, 9, 13, 17, 21], 1), Sequence([2, 4, 6, 8], 0), Sequence([3, 6, 9, 12, 15], 2)]
CFG = replace(TuneConfig(), epochs=2, batch_tokens=16, checkpoint_every=2, warmup_steps=1, autocast_bf16=False)


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def weights() -> list[torch.Tensor]:
    return [torch.ones(len(s.targets)) for s in SEQS]


class Stop(Exception):
    pass


def test_resume_from_a_weights_only_checkpoint_is_exact(tmp_path):
    straight = tiny_model()
    stats = train_ssm(straight, SEQS, weights(), CFG, 1, tmp_path / "straight")
    assert stats["steps"] > 3

    def stop_after_3(step, loss):
        if step == 3:  # the checkpoint of step 2 stays; step 3 is lost
            raise Stop

    folder = tmp_path / "resumed"
    with pytest.raises(Stop):
        train_ssm(tiny_model(), SEQS, weights(), CFG, 1, folder, after_step=stop_after_3)
    state = torch.load(checkpoint_path(folder), weights_only=True)  # only tensors and plain types inside
    assert state["step"] == 2
    lines = []
    resumed = tiny_model()
    train_ssm(resumed, SEQS, weights(), replace(CFG, resume=True), 1, folder, log=lines.append)
    assert any("resuming from the checkpoint at step 2/" in line for line in lines)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


class RunsCode:
    """Unpickling this with weights_only=False calls open(path, "w"): any code could run instead."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_checkpoint_with_code_is_refused_unrun(tmp_path):
    folder = tmp_path / "ssm-1"
    folder.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"model": RunsCode(str(marker)), "step": 1}, checkpoint_path(folder))
    with pytest.raises(Exception) as error:
        train_ssm(tiny_model(), SEQS, weights(), replace(CFG, resume=True), 1, folder)
    assert not marker.exists(), "the checkpoint's pickle ran code"
    assert "holds more than tensors and plain types" in str(error.value) and "\n" not in str(error.value)


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    folder = tmp_path / "ssm-1"
    folder.mkdir()
    checkpoint_path(folder).write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(Exception) as error:
        train_ssm(tiny_model(), SEQS, weights(), replace(CFG, resume=True), 1, folder)
    assert f"checkpoint {checkpoint_path(folder)} cannot be read" in str(error.value)
