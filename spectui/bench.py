"""`spectui bench`: every decoding method on the same prompts, greedy, in one process.

Methods (same verifier, same prompts, same max new tokens):
    incremental   ours, one token per verifier step (the baseline, --no-spec)
    hf-generate   transformers' generate(do_sample=False)
    hf-assisted   transformers' assisted generation with the preset's best single SSM
                  (the one with most parameters), or prompt lookup where it has none
    speculative   ours, tree speculation, once per merge policy (--merge union|vote|both):
                  method "speculative" merges by union, "speculative-vote" by vote (engine/merge.py)
Prompts run one after another, every method on each prompt in turn, after one warm-up. Speed-ups
are medians of per-prompt tokens/s ratios, per speculative row: against the faster of incremental
and hf-generate, and against hf-assisted. Each row's outputs are compared with incremental's and
hf-generate's. The report's top-level speculative figures are those of the first policy run
(union unless only vote ran); `by_merge` has them for every policy.
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

BASELINES = ("incremental", "hf-generate", "hf-assisted")
MERGE_CHOICES = ("union", "vote", "both")
SPEC_METHODS = {"union": "speculative", "vote": "speculative-vote"}  # merge policy -> method id
METHODS = (*BASELINES, "speculative")  # the methods with the default engine settings


def merge_policies(choice: str) -> tuple[str, ...]:
    """--merge union|vote|both -> the policies the bench runs speculative decoding with."""
    if choice not in MERGE_CHOICES:
        raise ValueError(f"--merge must be union, vote or both, not {choice!r}")
    return ("union", "vote") if choice == "both" else (choice,)


def method_label(name: str, merge: str | None) -> str:
    return f"speculative ({merge})" if merge else name


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
    drafted: int = 0  # tree nodes proposed over all steps (root excluded)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class MethodRuns:
    runs: list[Run] = field(default_factory=list)

    def summary(self, with_steps: bool, with_trees: bool = False) -> dict:
        tokens = sum(len(r.tokens) for r in self.runs)
        seconds = sum(r.seconds for r in self.runs)
        out = {"tokens_per_s": tokens / seconds if seconds else 0.0, "new_tokens": tokens}
        if with_steps:
            steps = sum(r.steps for r in self.runs)
            out["mean_accepted"] = tokens / steps if steps else 0.0
        if with_trees:  # drafted tree nodes per speculation step (the prefill drafts nothing)
            spec_steps = sum(r.steps - 1 for r in self.runs)
            out["mean_drafted"] = sum(r.drafted for r in self.runs) / spec_steps if spec_steps else 0.0
        return out


class Bench:
    def __init__(self, models, engine, max_new_tokens: int):
        self.models, self.engine = models, engine
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=0.0)
        self.stop_ids = models.stop_token_ids()
        self.assistant = max((m for _, m in models.ssms), key=lambda m: m.num_parameters(), default=None)

    def prompt_ids(self, prompt: str) -> list[int]:
        return encode_chat(self.models.tokenizer, [{"role": "user", "content": prompt}], self.models.chat_template)

    def run_engine(self, ids: list[int], speculate: bool, merge: str = "union") -> Run:
        settings = replace(self.settings, speculate=speculate, merge=merge)
        start, tokens, steps, drafted = time.perf_counter(), [], 0, 0
        for event in self.engine.generate(ids, settings):
            tokens += event.new_tokens
            steps += event.step > 0
            drafted += event.drafted
        return Run(tokens, time.perf_counter() - start, steps + 1, drafted)  # the prefill is a verifier step too

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
        if method == "incremental":
            return self.run_engine(ids, speculate=False)
        for merge, name in SPEC_METHODS.items():
            if method == name:
                return self.run_engine(ids, speculate=True, merge=merge)
        return self.run_hf(ids, assisted=method == "hf-assisted")


def run_bench(models, engine, prompts: list[str], max_new_tokens: int, progress=None, merge: str = "union") -> dict:
    """`merge`: union, vote or both (speculative decoding runs once per policy)."""
    policies = merge_policies(merge)
    methods = (*BASELINES, *(SPEC_METHODS[p] for p in policies))
    bench = Bench(models, engine, max_new_tokens)
    results = {m: MethodRuns() for m in methods}
    warm = bench.prompt_ids("Hello")
    for method in methods:  # warm-up: first calls pay for allocation and lazy initialisation
        bench.run(method, warm[:])
    for number, prompt in enumerate(prompts, 1):
        ids = bench.prompt_ids(prompt)
        for method in methods:
            results[method].runs.append(bench.run(method, ids))
        if progress:
            progress(number, len(prompts))
    return summarise(models, prompts, max_new_tokens, results, policies, engine.speculator_names)


def compare(spec: list[Run], results: dict[str, MethodRuns]) -> dict:
    """One speculative row against the baselines, prompt by prompt."""
    inc, hf = results["incremental"].runs, results["hf-generate"].runs
    assisted = results["hf-assisted"].runs
    vs_inc = [s.tokens_per_s / max(i.tokens_per_s, h.tokens_per_s) for s, i, h in zip(spec, inc, hf)]
    vs_assisted = [s.tokens_per_s / a.tokens_per_s for s, a in zip(spec, assisted) if a.tokens_per_s]
    return {
        "speedup_vs_incremental": statistics.median(vs_inc),
        "speedup_vs_hf_assisted": statistics.median(vs_assisted) if vs_assisted else None,
        "identical_outputs": sum(s.tokens == i.tokens for s, i in zip(spec, inc)),
        "identical_to_hf_generate": sum(s.tokens == h.tokens for s, h in zip(spec, hf)),
        "compared_outputs": len(spec),
    }


def summarise(
    models, prompts, max_new_tokens, results: dict[str, MethodRuns], policies=("union",), speculators=None
) -> dict:
    merge_of = {SPEC_METHODS[p]: p for p in policies}
    methods = {}
    for name, runs in results.items():
        methods[name] = runs.summary(with_steps=name == "incremental" or name in merge_of, with_trees=name in merge_of)
        if name in merge_of:
            methods[name]["merge"] = merge_of[name]
    by_merge = {}
    for policy in policies:
        name = SPEC_METHODS[policy]
        by_merge[policy] = {
            "method": name,
            "mean_accepted": methods[name]["mean_accepted"],
            "mean_drafted": methods[name]["mean_drafted"],
            **compare(results[name].runs, results),
        }
    first = by_merge[policies[0]]  # the top-level figures (union when it ran): the report's old shape
    return {
        "model": models.preset.name,
        "ssms": [name for name, _ in models.ssms],
        "speculators": list(speculators) if speculators is not None else None,
        "quant": models.quant,
        "device": models.device,
        "attention_backend": models.attention_backend,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "methods": methods,
        "merge": policies[0],
        "speedup_vs_incremental": first["speedup_vs_incremental"],
        "speedup_vs_hf_assisted": first["speedup_vs_hf_assisted"],
        "mean_accepted": first["mean_accepted"],
        "identical_outputs": first["identical_outputs"],
        "identical_to_hf_generate": first["identical_to_hf_generate"],
        "compared_outputs": first["compared_outputs"],
        "by_merge": by_merge,
    }


def format_table(report: dict) -> str:
    rows = [f"{'method':<21}{'tokens/s':>10}{'new tokens':>12}{'tokens/step':>13}{'tree nodes/step':>17}"]
    for name, m in report["methods"].items():
        steps = f"{m['mean_accepted']:.2f}" if "mean_accepted" in m else "-"
        drafted = f"{m['mean_drafted']:.2f}" if "mean_drafted" in m else "-"
        label = method_label(name, m.get("merge"))
        rows.append(f"{label:<21}{m['tokens_per_s']:>10.2f}{m['new_tokens']:>12}{steps:>13}{drafted:>17}")
    rows += [
        "",
        f"model {report['model']} ({report['quant']}, {report['device']}, attention {report['attention_backend']}), "
        f"{report['prompts']} prompts, {report['max_new_tokens']} max new tokens, greedy",
    ]
    speculators = report.get("speculators")
    if speculators is not None:
        rows.append(f"speculators: {', '.join(speculators) or 'none'}")
        if "vote" in report["by_merge"] and len(speculators) < 2:
            rows.append("(with a single speculator every node has one vote, so vote keeps the whole tree: union)")
    for policy, row in report["by_merge"].items():
        label, assisted = method_label(row["method"], policy), row["speedup_vs_hf_assisted"]
        rows += [
            f"{label} vs faster of incremental/hf-generate: {row['speedup_vs_incremental']:.2f}x (median per prompt)"
            + (f", vs hf-assisted: {assisted:.2f}x" if assisted else ", vs hf-assisted: n/a"),
            f"{label} output identical to incremental: {row['identical_outputs']}/{row['compared_outputs']}"
            f" (to hf-generate: {row['identical_to_hf_generate']}/{row['compared_outputs']})",
        ]
    return "\n".join(rows)
