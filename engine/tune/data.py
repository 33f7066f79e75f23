"""The distillation data: the verifier's own answers to the prompts, in resumable shards.

Every prompt is rendered exactly as `engine.chat.chat_turn` renders it (Conversation.prompt_ids with
the model's chat template), so an SSM learns the context it will see at inference. Answers come
from batched decoding with left padding (LeanModel where it runs the verifier, engine/batch_generate.py;
else transformers' `generate`, which gives the same greedy answers more slowly); batches alternate between greedy decoding and sampling
(`greedy_fraction`), so the SSMs see both the verifier's argmax paths and the wider spread of its
sampled continuations. Either way every answer token is a draw from the verifier (a point mass for
greedy), which makes it the target of a hard-label distillation: in expectation the cross-entropy
on sampled tokens equals the cross-entropy against the verifier's distribution.

Layout: OUT/data/shard-00000.jsonl, one batch per shard, one JSON line per example:
  {"prompt": str, "prompt_ids": [int], "answer_ids": [int], "mode": "greedy"|"sample", "finished": bool}
`answer_ids` end with the stop token when the verifier ended its turn (finished), so SSMs learn
to propose the end of a turn too. Shards are written to a temp file and renamed: a shard that
exists is complete, so --resume skips it.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..batch_generate import generate_batch
from ..chat import ContextError, Conversation
from ..lean_model import LeanModel, supports
from .features import FeatureRows, features_path, kept_features_dir, save_kept_features
from .magpie import normalise
from .teacher_head import use_teacher_head


@dataclass
class Example:
    prompt: str
    prompt_ids: list[int]
    answer_ids: list[int]
    mode: str  # "greedy" | "sample"
    finished: bool  # the verifier ended its turn (answer_ids[-1] is a stop token)


def data_dir(out: Path) -> Path:
    return Path(out) / "data"


def shard_path(out: Path, index: int) -> Path:
    return data_dir(out) / f"shard-{index:05d}.jsonl"


def write_shard(path: Path, examples: list[Example]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(e)) + "\n" for e in examples), encoding="utf-8")
    os.replace(tmp, path)


def read_shard(path: Path) -> list[Example]:
    return [Example(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def is_held_out(prompt: str, fraction: float) -> bool:
    """A stable split by prompt (a hash, not the order), so a prompt never sits on both sides."""
    return zlib.crc32(normalise(prompt).encode("utf-8")) % 10_000 < fraction * 10_000


def split(examples: list[Example], fraction: float) -> tuple[list[Example], list[Example]]:
    """-> (train, held out). Both sides get at least one example when there are two or more."""
    held = [e for e in examples if is_held_out(e.prompt, fraction)] if fraction > 0 else []
    train = [e for e in examples if not (fraction > 0 and is_held_out(e.prompt, fraction))]
    if fraction > 0 and len(examples) >= 2:
        if not held:
            held, train = train[-1:], train[:-1]
        elif not train:
            train, held = held[:1], held[1:]
    return train, held


def batch_mode(index: int, greedy_fraction: float) -> str:
    """Batch i is greedy when ceil((i+1) g) > ceil(i g): greedy batches spread evenly at rate g, batch 0 first."""
    return "greedy" if math.ceil((index + 1) * greedy_fraction) > math.ceil(index * greedy_fraction) else "sample"


def prompt_ids(tokenizer, prompt: str, context_window: int, max_answer_tokens: int, chat_template: str | None):
    """The engine's rendering of a one-message conversation (engine.chat.chat_turn does the same)."""
    conversation = Conversation()
    conversation.add("user", prompt)
    ids, _ = conversation.prompt_ids(tokenizer, context_window, max_answer_tokens, chat_template)
    return ids


@torch.no_grad()
def answer_batch(verifier, prompts: list[list[int]], mode: str, cfg, stop_ids: list[int],
                 runner=None, on_rows=None) -> list[tuple[list[int], bool]]:
    """Left-padded batched generate -> per prompt (answer ids up to and including the stop token, finished).

    runner: a LeanModel of the verifier (engine/batch_generate.py: greedy answers identical to
    transformers' generate, faster where prompts differ in length); None: transformers' generate.
    on_rows: the verifier's rows as they are computed (batch_generate.generate_batch; with a runner)."""
    if runner is not None:
        return generate_batch(runner, prompts, cfg.max_answer_tokens, stop_ids, greedy=mode == "greedy",
                              temperature=cfg.sample_temperature, top_p=cfg.sample_top_p, on_rows=on_rows)
    pad = stop_ids[0]
    width = max(map(len, prompts))
    x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # [B, W], left padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [B, W]
    device = next(verifier.parameters()).device
    kwargs = dict(max_new_tokens=cfg.max_answer_tokens, eos_token_id=stop_ids, pad_token_id=pad)
    if mode == "greedy":
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=cfg.sample_temperature, top_p=cfg.sample_top_p, top_k=0)
    out = verifier.generate(x.to(device), attention_mask=mask.to(device), **kwargs)[:, width:].tolist()  # [B, <=N]
    answers = []
    for row in out:
        stop = next((i for i, t in enumerate(row) if t in stop_ids), None)
        answers.append((row if stop is None else row[: stop + 1], stop is not None))
    return answers


def collect_answers(
    models,
    chat_template: str | None,
    batch_prompts: Callable[[int], tuple[list[str], bool]],
    cfg,
    out: Path,
    tick: Callable[[int], None] = lambda n: None,
    log: Callable[[str], None] = lambda line: None,
) -> tuple[list[Example], int, float]:
    """Fill OUT/data with shards until they hold `cfg.tokens` answer tokens (or the prompts run out).

    -> (all examples, answer tokens generated by this call, seconds spent generating them).

    batch_prompts(i) -> (the prompts of batch i, repeated); no prompts when there are no more.
    A batch of repeated prompts (a user file cycled to reach the token target) is sampled, since a
    second greedy answer would be a copy.
    """
    examples: list[Example] = []
    done, fresh, seconds = 0, 0, 0.0
    index, empty = 0, 0  # empty: batches in a row that gave no answer token (every prompt too long)
    stop_ids = models.stop_token_ids()
    runner = LeanModel(models.verifier) if supports(models.verifier) else None  # batched decoding without transformers' machinery
    if cfg.feature_head:  # every row's logits are kept: bf16 products, the top redone in fp32 (same top tokens)
        use_teacher_head(runner)
    while done < cfg.tokens:
        path = shard_path(out, index)
        if path.exists():
            shard = read_shard(path)
        else:
            texts, repeated = batch_prompts(index)
            if not texts:
                log(f"data: prompts ran out at {done} answer tokens (target {cfg.tokens})")
                break
            mode = "sample" if repeated else batch_mode(index, cfg.greedy_fraction)
            rendered = []
            for text in texts:
                try:
                    ids = prompt_ids(models.tokenizer, text, models.context_window, cfg.max_answer_tokens, chat_template)
                    rendered.append((text, ids))
                except ContextError:
                    log(f"data: prompt skipped, it does not fit the context window: {text[:60]!r}")
            torch.manual_seed(cfg.seed * 1_000_003 + index)  # sampled batches are reproducible
            began = time.perf_counter()
            kept = FeatureRows() if cfg.feature_head and runner is not None else None
            answers = answer_batch(models.verifier, [ids for _, ids in rendered], mode, cfg, stop_ids, runner,
                                   None if kept is None else kept.add) if rendered else []
            shard = [Example(t, ids, a, mode, fin) for (t, ids), (a, fin) in zip(rendered, answers)]
            if kept is not None and shard:  # the feature head's rows, kept as the answers were decoded
                save_kept_features(features_path(kept_features_dir(out), index), shard, kept)
            seconds += time.perf_counter() - began
            fresh += sum(len(a) for a, _ in answers)
            write_shard(path, shard)
        new = sum(len(e.answer_ids) for e in shard)
        empty = 0 if new else empty + 1
        if empty >= 5:
            log(f"data: 5 batches in a row gave no answers; stopping at {done} answer tokens")
            break
        examples += shard
        done += new
        tick(new)
        index += 1
    return examples, fresh, seconds
