"""The verifier's next-token distributions over the training sequences: soft targets, cached.

Hard labels (the answer tokens) tell an SSM which token the verifier emitted; its distribution
tells it also how sure the verifier was and what came second, which is what a drafter that is
verified top-k wants to learn (DistillSpec, Zhou et al. 2024: KL on the teacher's distribution
beats labels alone). For every training sequence (prompt + answer, as train.to_sequences cuts it)
one teacher-forced verifier pass gives, at every position t < len - 1,

    top_ids[t]   the verifier's K most likely next tokens             [L - 1, K] int32
    top_logp[t]  their log-probabilities (full-vocabulary softmax)    [L - 1, K] float16

K = 8 keeps ~0.9 of the probability mass on these answers at 48 bytes a position. A pass over the
sequences runs at prefill speed (LeanModel, each sequence alone: 727 positions/s on 8 real
sequences of 114-742 tokens, against 290 for transformers' forward on right-padded batches, with the
same top-8), a fraction of the time the answers took.

Cache: OUT/teacher/part-NNNNN.safetensors, one per PART training sequences in order, written to a
temp file and renamed (a file that exists is complete). Each holds its sequences' digests, so a
part whose data changed (another max_seq_len, more answers) is recomputed, not misread.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import torch

from .train import Sequence, collate, make_batches

PART = 64  # sequences per cache file


def teacher_path(out: Path, index: int) -> Path:
    return Path(out) / "teacher" / f"part-{index:05d}.safetensors"


def digest(ids: list[int]) -> bytes:
    return hashlib.sha1(torch.tensor(ids, dtype=torch.int32).numpy().tobytes()).digest()[:12]


def top_rows(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] -> (top_ids [n, k] int32, top_logp [n, k] float16) of the full-vocabulary softmax."""
    top = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
    return top.indices.to(torch.int32).cpu(), top.values.to(torch.float16).cpu()


@torch.no_grad()
def teacher_topk(verifier, seqs: list[Sequence], k: int, batch_tokens: int,
                 runner=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """-> per sequence (top_ids [L-1, k] int32, top_logp [L-1, k] float16) of the verifier, teacher-forced.

    runner: a LeanModel of the verifier (engine/lean_model.py), which runs each sequence alone (no
    padding, the causal prefill path); None: transformers' forward on right-padded batches."""
    if runner is not None:
        out = []
        for seq in seqs:
            runner.reset()
            out.append(top_rows(runner.forward_chain(seq.ids[:-1]), k))  # logits [L-1, V]
        runner.reset()
        return out
    device = next(verifier.parameters()).device
    out: list = [None] * len(seqs)
    for group in make_batches(seqs, batch_tokens):
        ids, _ = collate([seqs[i] for i in group])  # [B, T], right padded
        lengths = [len(seqs[i].ids) for i in group]
        real = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()  # [B, T]
        logits = verifier(input_ids=ids.to(device), attention_mask=real.to(device)).logits  # [B, T, V]
        for row, (i, n) in enumerate(zip(group, lengths)):
            out[i] = top_rows(logits[row, : n - 1], k)
        del logits
    return out


def save_teacher(path: Path, seqs: list[Sequence], rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "digests": torch.frombuffer(bytearray(b"".join(digest(s.ids) for s in seqs)), dtype=torch.uint8).clone(),
        "lengths": torch.tensor([len(s.ids) - 1 for s in seqs], dtype=torch.int64),
        "top_ids": torch.cat([r[0] for r in rows]),
        "top_logp": torch.cat([r[1] for r in rows]),
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def load_teacher(path: Path, seqs: list[Sequence], k: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The cached rows for exactly these sequences with at least k tokens each, or None."""
    from safetensors.torch import load_file

    try:
        data = load_file(str(path))
    except Exception:  # noqa: BLE001 - missing, truncated or foreign: recompute
        return None
    expected = b"".join(digest(s.ids) for s in seqs)
    if bytes(data["digests"].numpy().tobytes()) != expected or data["top_ids"].shape[1] < k:
        return None
    lengths = data["lengths"].tolist()
    ids = torch.split(data["top_ids"][:, :k], lengths)
    logp = torch.split(data["top_logp"][:, :k], lengths)
    return list(zip(ids, logp))


def ensure_teacher(
    verifier, seqs: list[Sequence], out: Path, k: int, batch_tokens: int,
    tick: Callable[[int], None] = lambda n: None, log: Callable[[str], None] = lambda line: None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Soft targets for `seqs` (cached per part of PART sequences, in order) -> per sequence its rows."""
    from ..lean_model import LeanModel, supports

    runner = LeanModel(verifier) if supports(verifier) else None  # 2.5x transformers' padded batches here
    rows: list[tuple[torch.Tensor, torch.Tensor]] = []
    computed = parts = 0
    for index, lo in enumerate(range(0, len(seqs), PART)):
        part = seqs[lo : lo + PART]
        path = teacher_path(out, index)
        cached = load_teacher(path, part, k)
        if cached is None:
            cached = teacher_topk(verifier, part, k, batch_tokens, runner)
            save_teacher(path, part, cached)
            computed += 1
        rows += cached
        parts += 1
        tick(sum(len(s.ids) for s in part))
    log(f"teacher: the verifier's top-{k} at {sum(len(r[0]) for r in rows)} positions "
        f"({computed} of {parts} parts computed, the rest cached)")
    return rows
