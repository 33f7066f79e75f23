"""`spectui tune-eval`: how well SSMs agree with the verifier on prompts they were never tuned on.

The verifier (as the engine loads it, NF4 by default) answers every prompt of the file greedily;
each SSM, loaded as the engine loads drafters (and refused, like there, when its vocabulary
differs from the verifier's), is teacher-forced on prompt + answer, and the share
of answer tokens where its top-1 (top-k) is the verifier's token is reported per prompt category,
for each SSM and for all of them together (engine/tune/heldout.py). The answers are cached in
<cache dir>/eval-answers, so measuring new SSMs on the same prompts costs only their forwards.

    spectui tune-eval                 # the Vicuna-bench questions shipped with spectui (spectui/data/)
    spectui tune-eval --prompts ../shared/data/spec_bench_dev.jsonl --per-category 4 --ssm OUT/ssm-1
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from . import paths
from .data import bench_questions
from .options import DeviceOpt, ModelOpt, PromptsOpt, QuantOpt, UsageFailure, check_writable, friendly_errors


def tune_eval(
    model: str = ModelOpt,
    ssm: Optional[list[str]] = typer.Option(None, "--ssm", help="SSM folder to measure; repeatable (default: every SSM the preset names, its extra ones too)"),
    prompts: Optional[Path] = PromptsOpt,
    per_category: Optional[int] = typer.Option(None, "--per-category", help="the first N prompts of each category"),
    limit: Optional[int] = typer.Option(None, "--limit", help="the first N prompts"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="length of the verifier's greedy answers"),
    top_k: int = typer.Option(3, "--top-k", help="k of the top-k agreement"),
    quant: str = QuantOpt,
    device: str = DeviceOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="write the report as JSON to PATH, or - for stdout"),
) -> None:
    """Teacher-forced agreement of SSMs with the verifier's greedy answers, per prompt category."""
    from dataclasses import replace

    from .bench import read_prompts
    from .engine import PromptFileError
    from .engine import load_models, resolve_model, resolve_ssm
    from .engine.tune import agreement_by_category, greedy_answers

    with friendly_errors():
        if max_new_tokens < 1 or top_k < 1 or (per_category is not None and per_category < 1) or (limit is not None and limit < 1):
            raise UsageFailure("--max-new-tokens, --top-k, --per-category and --limit must be at least 1")
        if json_out and json_out != "-":
            check_writable(Path(json_out), "--json")
        prompts = prompts or bench_questions()
        try:
            chosen = read_prompts(prompts, limit, per_category)
        except PromptFileError as exc:
            raise UsageFailure(str(exc)) from None
        preset = resolve_model(model)
        sources = [resolve_ssm(s) for s in ssm] if ssm else list(preset.made_for)
        if not sources:
            raise UsageFailure(f"{preset.name} has no SSMs: name some with --ssm")
        models = load_models(replace(preset, ssms=tuple(sources)), quant=quant, device=device, models_dir=paths.models_dir())
        drafters = models.ssms  # (name, model), loaded as the engine drafts with them
        pairs = [(str(p), p.category) for p in chosen]
        typer.echo(f"answering {len(pairs)} prompts greedily ({max_new_tokens} tokens; cached after the first run)", err=True)
        answered = greedy_answers(models, models.chat_template, pairs, max_new_tokens, paths.cache_dir() / "eval-answers")
        report = agreement_by_category(drafters, answered, top_k)
    report = {"model": preset.name, "quant": quant, "prompts": str(prompts), "max_new_tokens": max_new_tokens,
              "top_k": top_k, "ssms": [name for name, _ in drafters], **report}
    if json_out == "-":
        typer.echo(json.dumps(report, indent=2))
        return
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for line in table(report):
        typer.echo(line)


def table(report: dict) -> list[str]:
    """One row per category (then all): top-1 and top-k per SSM, and together."""
    k, names = report["top_k"], report["ssms"]
    head = "| prompts | answer tokens | " + " | ".join(f"{n} top-1 / top-{k}" for n in names) + f" | together top-1 / top-{k} |"
    lines = [head, "|---|---:|" + "---:|" * (len(names) + 1)]
    rows = [*report["categories"].items(), ("all", report["all"])]
    for name, row in rows:
        cells = [f"{s['top1']:.1%} / {s[f'top{k}']:.1%}" for s in row["ssms"]]
        together = row["together"]
        lines.append(f"| {name} | {row['positions']} | " + " | ".join(cells)
                     + f" | {together['top1']:.1%} / {together[f'top{k}']:.1%} |")
    return lines
