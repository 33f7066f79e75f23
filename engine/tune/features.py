"""The verifier's own features over training text: what a feature drafter (EAGLE) learns from.

A feature drafter (engine/feature_head.py) predicts the verifier's next final hidden state from its
current one and the next token's embedding, and reads the draft token off the verifier's own output
layer. Its training data is therefore the verifier's state sequence over real text: for every
sequence (prompt + answer ids, as the engine renders them), one teacher-forced pass gives, at every
position t,

    hidden[t]    the verifier's final normed hidden state after token t     [L, H]  bfloat16
    top_ids[t]   its K most likely next tokens                              [L, K]  int32
    top_logp[t]  their log-probabilities (full-vocabulary softmax)          [L, K]  float16

The drafter models the verifier's dynamics (state, token) -> next state, not the text, so prompt
positions are data as good as answer positions; both are kept, with `answer_start` marking where
the verifier's own words begin. One file per answer shard (OUT/features/part-NNNNN.safetensors),
written to a temp file and renamed, so a file that exists is complete and a resumed run skips it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .teacher import top_rows

K = 4  # verifier tokens kept per position


def features_path(out: Path, index: int) -> Path:
    return Path(out) / "features" / f"part-{index:05d}.safetensors"


def kept_sequence(example):
    """The example as far as rows are kept while answering: prompt + answer[:-1] (the last answer
    token is never fed, so it has no row)."""
    return replace(example, answer_ids=list(example.answer_ids)[:-1])


def kept_features_dir(out: Path) -> Path:
    """Where `spectui tune --feature-head` keeps the rows of each answer shard (its features/part-N
    for OUT/data's shard N), made as the answers were decoded."""
    return Path(out) / "answer-rows"


class KeptRows:
    """The rows kept while answering (kept_features_dir), found by sequence: prompt + answer[:-1]."""

    def __init__(self, folder: Path) -> None:
        self.where: dict[tuple[int, ...], tuple[Path, int, int]] = {}
        self._file: tuple[Path, dict] | None = None
        from safetensors import safe_open

        for path in sorted((Path(folder) / "features").glob("part-*.safetensors")):
            with safe_open(str(path), "pt") as f:
                ids, starts = f.get_tensor("ids").tolist(), f.get_tensor("starts").tolist()
            for s, e in zip(starts[:-1], starts[1:]):
                self.where[tuple(ids[s:e])] = (path, s, e)

    def rows(self, example) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(hidden, top_ids, top_logp) over prompt + answer[:-1], or None if none were kept for it."""
        if not example.answer_ids:
            return None
        kept = kept_sequence(example)
        found = self.where.get(tuple(list(kept.prompt_ids) + kept.answer_ids))
        if found is None:
            return None
        path, s, e = found
        if self._file is None or self._file[0] != path:  # examples come in shard order: one file at a time
            self._file = (path, read_features(path))
        data = self._file[1]
        return data["hidden"][s:e], data["top_ids"][s:e], data["top_logp"][s:e]


@torch.inference_mode()
def feature_pass(runner, ids: list[int], k: int = K) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (hidden [L, H] bf16, top_ids [L, k] int32, top_logp [L, k] fp16) of the verifier over `ids`.

    runner: a LeanModel of the verifier (it keeps the final hidden states of its last run)."""
    runner.reset()
    runner.keep_hidden = True
    logits = runner.forward_chain(list(ids))  # [L, V]
    hidden = runner.hidden[0].to(torch.bfloat16)  # [L, H]
    top_ids, top_logp = top_rows(logits, k)
    runner.reset()
    return hidden, top_ids, top_logp


def write_features(path: Path, examples, runner, k: int = K, kept: "KeptRows | None" = None) -> int:
    """One file for a shard of Examples (prompt_ids + answer_ids each), from teacher-forced passes of
    `runner` (a LeanModel), or from the rows kept while answering (`kept`, over prompt +
    answer[:-1]) where it holds them. -> positions written."""
    written, feats = [], []
    for e in examples:
        rows = None if kept is None else kept.rows(e)
        if rows is None:
            written.append(e)
            feats.append(feature_pass(runner, list(e.prompt_ids) + list(e.answer_ids), k))
        else:
            written.append(kept_sequence(e))
            feats.append(rows)
    return save_features(path, written, feats)


class FeatureRows:
    """A shard's feature rows kept while batched decoding makes its answers (batch_generate.py
    `on_rows`), instead of a teacher-forced pass afterwards, at no extra forward: the same hidden
    states and top tokens, bit for bit, and their log-probabilities to float32 rounding."""

    def __init__(self, k: int = K) -> None:
        self.k = k
        self.rows: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def add(self, b: int, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Prompt b's next rows: logits [n, V], hidden [n, H]."""
        top_ids, top_logp = top_rows(logits, self.k)
        self.rows.setdefault(b, []).append((hidden.to(torch.bfloat16), top_ids, top_logp))

    def of(self, b: int, prompt_len: int, answer_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompt b's (hidden [L, H], top_ids [L, k], top_logp [L, k]) over prompt + answer[:-1]:
        L = prompt_len + max(answer_len - 1, 0). The last answer token is never fed, so it has no row."""
        n = prompt_len + max(answer_len - 1, 0)
        parts = self.rows[b]
        return tuple(torch.cat([part[i] for part in parts])[:n] for i in range(3))


def save_kept_features(path: Path, examples, kept: FeatureRows) -> int:
    """Write a shard's features from the rows kept while answering: each sequence is prompt +
    answer[:-1] (what has rows). -> positions."""
    return save_features(path, [kept_sequence(e) for e in examples],
                         [kept.of(b, len(e.prompt_ids), len(e.answer_ids)) for b, e in enumerate(examples)])


def save_features(path: Path, examples, feats) -> int:
    """Write a shard's features: per example (hidden [L, H], top_ids [L, k], top_logp [L, k]) over its
    prompt_ids + answer_ids, as their concatenated rows and the bounds of each sequence. -> positions."""
    starts, answer_starts, ids = [0], [], []
    for example in examples:
        seq = list(example.prompt_ids) + list(example.answer_ids)
        ids.append(torch.tensor(seq, dtype=torch.int32))
        answer_starts.append(starts[-1] + len(example.prompt_ids))
        starts.append(starts[-1] + len(seq))
    tensors = {
        "hidden": torch.cat([f[0] for f in feats]), "top_ids": torch.cat([f[1] for f in feats]),
        "top_logp": torch.cat([f[2] for f in feats]),
        "ids": torch.cat(ids), "starts": torch.tensor(starts, dtype=torch.int64),
        "answer_starts": torch.tensor(answer_starts, dtype=torch.int64),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return starts[-1]


def verifier_rows(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A transformers folder's input embedding [V, H] and output layer [V, H] (the same tensor when
    tied, as SmolLM2's), read from its safetensors without building the model: what a FeatureHead
    borrows (FeatureHead.attach) when it is trained or scored apart from the engine."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
        head = f.get_tensor("lm_head.weight") if "lm_head.weight" in f.keys() else embed
    return embed, head


def read_features(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
