"""Agreement on prompts the SSMs never saw: how `spectui tune evaluate` measures SSMs.

For an evaluation prompt file (the Vicuna questions, a per-category sample of Spec-Bench) the
verifier, loaded as the engine loads it (NF4 by default), answers every prompt greedily (batched
`generate`, left padded, at most `max_new_tokens` tokens). Each SSM is then teacher-forced on
prompt + answer, and evaluate.agreement counts, at every answer position, whether the SSM's top-1
(top-k) is the verifier's token: the acceptance a chain (a width-k tree level) of that SSM can
hope for on such prompts. Figures are reported per prompt category and over all prompts.

The answers depend only on (verifier, quantisation, prompts, max_new_tokens), so they are cached
in a JSON-lines file named by a digest of those (the caller names the folder): a second SSM, or
the same SSMs after more training, is measured on the very same answers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from .data import Example, answer_batch, prompt_ids
from .evaluate import evaluate
from .train import to_sequences

BATCH = 16  # prompts per generate call


def answers_path(cache: Path, model_name: str, quant: str, prompts: list[tuple[str, str | None]], max_new_tokens: int) -> Path:
    key = json.dumps([model_name, quant, max_new_tokens, prompts], ensure_ascii=False)
    return Path(cache) / f"answers-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"


def greedy_answers(models, template: str | None, prompts: list[tuple[str, str | None]], max_new_tokens: int,
                   cache: Path | None = None, tick=lambda n: None) -> list[tuple[Example, str | None]]:
    """-> per prompt (its Example with the verifier's greedy answer, its category); cached when `cache` is given."""
    path = answers_path(cache, models.preset.name, models.quant, prompts, max_new_tokens) if cache else None
    if path is not None and path.exists():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if len(rows) == len(prompts):
            return [(Example(**row["example"]), row["category"]) for row in rows]
    cfg = SimpleNamespace(max_answer_tokens=max_new_tokens)
    stop = models.stop_token_ids()
    rendered = [prompt_ids(models.tokenizer, text, models.context_window, max_new_tokens, template) for text, _ in prompts]
    out: list[tuple[Example, str | None]] = []
    order = sorted(range(len(prompts)), key=lambda i: len(rendered[i]))  # similar lengths share a batch: less padding
    answers: dict[int, tuple[list[int], bool]] = {}
    for lo in range(0, len(order), BATCH):
        group = order[lo : lo + BATCH]
        for i, answer in zip(group, answer_batch(models.verifier, [rendered[i] for i in group], "greedy", cfg, stop)):
            answers[i] = answer
        tick(len(group))
    for i, (text, category) in enumerate(prompts):
        ids, finished = answers[i]
        out.append((Example(text, rendered[i], ids, "greedy", finished), category))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({"example": asdict(e), "category": c}) + "\n" for e, c in out), encoding="utf-8")
        tmp.replace(path)
    return out


def agreement_by_category(ssms: list[tuple[str, object]], answered: list[tuple[Example, str | None]], top_k: int,
                          max_seq_len: int = 4096, batch_tokens: int = 4096) -> dict:
    """{"all": report, "categories": {category: report}}; each report as evaluate.agreement gives it."""
    groups: dict[str, list[Example]] = {}
    for example, category in answered:
        groups.setdefault(category or "all", []).append(example)
    everything = to_sequences([e for e, _ in answered], max_seq_len)
    result = {"all": evaluate(ssms, everything, top_k, batch_tokens)["all"], "categories": {}}
    if len(groups) > 1:
        for category, examples in groups.items():
            result["categories"][category] = evaluate(ssms, to_sequences(examples, max_seq_len), top_k, batch_tokens)["all"]
    return result
