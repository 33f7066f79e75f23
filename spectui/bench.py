"""`spectui bench`: every decoding method on the same prompts, greedy, in one process.

Methods (same verifier, same prompts, same max new tokens):
    incremental   ours, one token per verifier step (the baseline, --no-spec)
    hf-generate   transformers' generate(do_sample=False)
    hf-assisted   transformers' assisted generation with the preset's best single SSM
                  (the one with most parameters), or prompt lookup where it has none
    speculative   ours, tree speculation
Prompts run one after another, every method on each prompt in turn, after one warm-up. Speed-ups
are medians of per-prompt tokens/s ratios: speculative against the faster of incremental and
hf-generate, and against hf-assisted. Outputs of speculative and incremental are compared.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .engine.chat import encode_chat
from .engine.settings import GenerationSettings

METHODS = ("incremental", "hf-generate", "hf-assisted", "speculative")


class PromptFileError(ValueError):
    pass


def read_prompts(path: Path, limit: int | None) -> list[str]:
    """JSONL with `turns` (first turn used) or a text file with one prompt per line."""
    try:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"cannot read prompts from {path}: {exc}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.startswith("{"):
            try:
                prompts.append(json.loads(line)["turns"][0])
            except (ValueError, KeyError, IndexError, TypeError):
                raise PromptFileError(f"{path}, line {number}: expected a JSON object with a 'turns' list") from None
        else:
            prompts.append(line)
    if not prompts:
        raise PromptFileError(f"{path} holds no prompts")
    return prompts[:limit] if limit else prompts


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    steps: int = 0

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class MethodRuns:
    runs: list[Run] = field(default_factory=list)

    def summary(self, with_steps: bool) -> dict:
        tokens = sum(len(r.tokens) for r in self.runs)
        seconds = sum(r.seconds for r in self.runs)
        out = {"tokens_per_s": tokens / seconds if seconds else 0.0, "new_tokens": tokens}
        if with_steps:
            steps = sum(r.steps for r in self.runs)
            out["mean_accepted"] = tokens / steps if steps else 0.0
        return out


class Bench:
    def __init__(self, models, engine, max_new_tokens: int):
        self.models, self.engine = models, engine
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=0.0)
        self.stop_ids = models.stop_token_ids()
        self.assistant = max((m for _, m in models.ssms), key=lambda m: m.num_parameters(), default=None)

    def prompt_ids(self, prompt: str) -> list[int]:
        return encode_chat(self.models.tokenizer, [{"role": "user", "content": prompt}], self.models.chat_template)

    def run_engine(self, ids: list[int], speculate: bool) -> Run:
        settings = replace(self.settings, speculate=speculate)
        start, tokens, steps = time.perf_counter(), [], 0
        for event in self.engine.generate(ids, settings):
            tokens += event.new_tokens
            steps += event.step > 0
        return Run(tokens, time.perf_counter() - start, steps + 1)  # the prefill is a verifier step too

    @torch.inference_mode()
    def run_hf(self, ids: list[int], assisted: bool) -> Run:
        inputs = torch.tensor([ids], device=self.models.verifier.device)
        kwargs = dict(max_new_tokens=self.settings.max_new_tokens, do_sample=False, eos_token_id=self.stop_ids)
        kwargs["pad_token_id"] = self.stop_ids[0] if self.stop_ids else None
        if assisted and self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        elif assisted:
            kwargs["prompt_lookup_num_tokens"] = 10
        start = time.perf_counter()
        out = self.models.verifier.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
        return Run(out[0, len(ids) :].tolist(), time.perf_counter() - start)

    def run(self, method: str, ids: list[int]) -> Run:
        if method in ("incremental", "speculative"):
            return self.run_engine(ids, speculate=method == "speculative")
        return self.run_hf(ids, assisted=method == "hf-assisted")


def run_bench(models, engine, prompts: list[str], max_new_tokens: int, progress=None) -> dict:
    bench = Bench(models, engine, max_new_tokens)
    results = {m: MethodRuns() for m in METHODS}
    warm = bench.prompt_ids("Hello")
    for method in METHODS:  # warm-up: first calls pay for allocation and lazy initialisation
        bench.run(method, warm[:])
    for number, prompt in enumerate(prompts, 1):
        ids = bench.prompt_ids(prompt)
        for method in METHODS:
            results[method].runs.append(bench.run(method, ids))
        if progress:
            progress(number, len(prompts))
    return summarise(models, prompts, max_new_tokens, results)


def summarise(models, prompts, max_new_tokens, results: dict[str, MethodRuns]) -> dict:
    spec, inc = results["speculative"].runs, results["incremental"].runs
    hf, assisted = results["hf-generate"].runs, results["hf-assisted"].runs
    vs_inc = [s.tokens_per_s / max(i.tokens_per_s, h.tokens_per_s) for s, i, h in zip(spec, inc, hf)]
    vs_assisted = [s.tokens_per_s / a.tokens_per_s for s, a in zip(spec, assisted) if a.tokens_per_s]
    methods = {
        name: runs.summary(with_steps=name in ("incremental", "speculative")) for name, runs in results.items()
    }
    return {
        "model": models.preset.name,
        "ssms": [name for name, _ in models.ssms],
        "quant": models.quant,
        "device": models.device,
        "attention_backend": models.attention_backend,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "methods": methods,
        "speedup_vs_incremental": statistics.median(vs_inc),
        "speedup_vs_hf_assisted": statistics.median(vs_assisted) if vs_assisted else None,
        "mean_accepted": methods["speculative"]["mean_accepted"],
        "identical_outputs": sum(s.tokens == i.tokens for s, i in zip(spec, inc)),
        "identical_to_hf_generate": sum(s.tokens == h.tokens for s, h in zip(spec, hf)),
        "compared_outputs": len(spec),
    }


def format_table(report: dict) -> str:
    rows = [f"{'method':<14}{'tokens/s':>10}{'new tokens':>12}{'tokens/step':>13}"]
    for name, m in report["methods"].items():
        steps = f"{m['mean_accepted']:.2f}" if "mean_accepted" in m else "-"
        rows.append(f"{name:<14}{m['tokens_per_s']:>10.2f}{m['new_tokens']:>12}{steps:>13}")
    assisted = report["speedup_vs_hf_assisted"]
    rows += [
        "",
        f"model {report['model']} ({report['quant']}, {report['device']}, attention {report['attention_backend']}), "
        f"{report['prompts']} prompts, {report['max_new_tokens']} max new tokens, greedy",
        f"speculative vs faster of incremental/hf-generate: {report['speedup_vs_incremental']:.2f}x (median per prompt)",
        f"speculative vs hf-assisted: {assisted:.2f}x" if assisted else "speculative vs hf-assisted: n/a",
        f"speculative output identical to incremental: {report['identical_outputs']}/{report['compared_outputs']}"
        f" (to hf-generate: {report['identical_to_hf_generate']}/{report['compared_outputs']})",
    ]
    return "\n".join(rows)
