"""The verifier's soft targets (engine/tune/teacher.py) on a tiny random LLaMA: right, cached, refreshed."""

from __future__ import annotations

import pytest
import torch

from spectui.engine.loading import load_causal_lm
from spectui.engine.tune.teacher import PART, ensure_teacher, load_teacher, teacher_path, teacher_topk
from spectui.engine.tune.train import Sequence


@pytest.fixture(scope="module")
def verifier(tiny_dirs):
    return load_causal_lm(tiny_dirs["verifier"], "cpu", "none")


def sequences(count: int, seed: int = 0) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = 5 + int(torch.randint(0, 20, (1,), generator=g))
        out.append(Sequence(torch.randint(3, 1000, (n,), generator=g).tolist(), start=min(2, n - 2)))
    return out


@torch.no_grad()
def test_batched_rows_equal_each_sequence_alone(verifier):
    seqs = sequences(6)
    rows = teacher_topk(verifier, seqs, 4, batch_tokens=64)  # several sequences per padded batch
    for s, (ids, logp) in zip(seqs, rows):
        alone = torch.log_softmax(verifier(input_ids=torch.tensor([s.ids])).logits[0, :-1].float(), -1)  # [L-1, V]
        top = torch.topk(alone, 4, dim=-1)
        assert ids.shape == (len(s.ids) - 1, 4) and ids.dtype == torch.int32 and logp.dtype == torch.float16
        assert torch.equal(ids[:, 0].long(), top.indices[:, 0])  # the verifier's argmax at every position
        assert torch.allclose(logp.float(), top.values, atol=2e-2)  # float16 storage


@torch.no_grad()
def test_lean_runner_gives_the_same_soft_targets(tiny_dirs):
    from spectui.engine.lean_model import LeanModel
    from spectui.kernels.hf_attention import register_tree_attention

    nf4 = load_causal_lm(tiny_dirs["verifier"], "cpu", "nf4", register_tree_attention("exact"))  # as tune loads it
    seqs = sequences(5, seed=2)
    padded = teacher_topk(nf4, seqs, 4, batch_tokens=64)
    lean = teacher_topk(nf4, seqs, 4, batch_tokens=64, runner=LeanModel(nf4))  # each sequence alone
    for (ids, logp), (lean_ids, lean_logp) in zip(padded, lean):
        assert lean_ids.shape == ids.shape and torch.equal(lean_ids[:, 0], ids[:, 0])
        assert torch.allclose(lean_logp.float(), logp.float(), atol=2e-2)


def test_cache_is_reused_and_refreshed_when_the_data_changes(verifier, tmp_path):
    seqs = sequences(PART + 3, seed=1)  # two parts
    lines = []
    first = ensure_teacher(verifier, seqs, tmp_path, 3, 256, log=lines.append)
    assert "2 of 2 parts computed" in lines[-1]
    stamps = [teacher_path(tmp_path, i).stat().st_mtime_ns for i in range(2)]
    again = ensure_teacher(verifier, seqs, tmp_path, 3, 256, log=lines.append)
    assert "0 of 2 parts computed" in lines[-1]
    assert [teacher_path(tmp_path, i).stat().st_mtime_ns for i in range(2)] == stamps
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    changed = seqs[:PART] + sequences(3, seed=2)  # the second part's sequences differ
    ensure_teacher(verifier, changed, tmp_path, 3, 256, log=lines.append)
    assert "1 of 2 parts computed" in lines[-1]
    assert load_teacher(teacher_path(tmp_path, 0), seqs[:PART], 5) is None  # fewer tokens kept than asked: recompute


def test_a_corrupt_part_is_recomputed(verifier, tmp_path):
    seqs = sequences(3, seed=3)
    ensure_teacher(verifier, seqs, tmp_path, 2, 256)
    teacher_path(tmp_path, 0).write_bytes(b"not safetensors")
    assert load_teacher(teacher_path(tmp_path, 0), seqs, 2) is None
    lines = []
    ensure_teacher(verifier, seqs, tmp_path, 2, 256, log=lines.append)
    assert "1 of 1 parts computed" in lines[-1]
    assert load_teacher(teacher_path(tmp_path, 0), seqs, 2) is not None
