"""What `spectui bench` measured, and how it is summarised: per-prompt rows, ratios, the table.

The bench exists to prove or disprove "adaptive speculation is never slower than incremental
decoding, and faster where drafts agree". That is a claim about every prompt, so the unit of
comparison is the per-prompt ratio

    speedup(m, base, p) = tokens/s of method m on prompt p / tokens/s of base on prompt p

(both measured back to back, so slow drift of the machine cancels), summarised per method by
its geometric mean (the right mean for ratios: 2x and 0.5x average to 1x), its minimum (the
worst prompt: "never slower" stands or falls on it) and geometric means per prompt category.
A method measured several times on a prompt (the bench's re-runs) counts the median of its
pairwise ratios there.

The JSON report (run_bench in bench.py):
    model, ssms, speculators, quant, device, attention_backend, linear4bit (the verifier's 4-bit
    path: spectui's AVX2 kernel or bitsandbytes', or null), threads (torch threads, every
    method), thread_switches (times our engine changed its threads because other processes held
    cores: 0 on the quiet machine timings need), prompts, max_new_tokens, tree (the speculative rows' --tree), fixed_tree,
    merge (policies run), hf_assistant (SSM name or null), not_run ({method: why} for the
    assisted and pipelined rows when they could not run here), order ("rotated"), rerun_below,
    rerun_total, cost_model and calibration (the engine's, or null);
    methods: {id: {tokens_per_s, new_tokens; ours: mean_accepted (tokens per verifier step,
        prefill included), ttft_ms (mean), decode_tokens_per_s (tokens after the first over the
        time after it), prefill_tokens_per_s (prompt tokens over time to first token); speculative rows: mean_drafted (tree nodes per
        speculation step), identical_outputs, identical_to_hf_generate, compared_outputs,
        slower_prompts (indices under rerun_below x incremental), and per base B in
        incremental, hf_generate, hf_prompt_lookup, hf_assisted (those that ran):
        geomean_speedup_vs_B, min_speedup_vs_B {speedup, index, category},
        geomean_speedup_vs_B_by_category {category: geomean}}};
    per_prompt: [{index, category, prompt_tokens, reruns, methods: {id: {tokens_per_s,
        new_tokens; ours: ttft_ms, decode_tokens_per_s; speculative rows: speedup_vs_incremental, mean_accepted,
        identical}}}].
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

INCREMENTAL = "incremental"
DEFAULT_SPEC = "speculative"  # the default-tree row the "never slower" claim is about
SPEC_METHODS = ("speculative-fixed", "speculative", "speculative-pipelined", "speculative-vote")  # ours, with speculation
OURS = (INCREMENTAL, *SPEC_METHODS)  # the engine's methods: verifier steps and TTFT are known
BASES = (INCREMENTAL, "hf-generate", "hf-prompt-lookup", "hf-assisted")  # what speculative rows are compared with
UNCATEGORISED = "uncategorised"  # the by-category key for prompts without a category


@dataclass
class Run:
    """One method answering one prompt."""

    tokens: list[int]  # the new token ids, end-of-turn token included when it came
    seconds: float  # wall time of the whole call, prefill included
    steps: int = 0  # verifier forward passes, the prefill included (0: not counted, transformers' methods)
    drafted: int = 0  # tree nodes proposed over all steps (roots excluded)
    ttft_s: float | None = None  # wall time from the call to the first event (the prefill's), ours only

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens per verifier pass, the prefill's included; None where passes were not counted."""
        return len(self.tokens) / self.steps if self.steps else None

    @property
    def decode_s(self) -> float | None:
        """Wall time after the first token (the prefill's): the decoding alone; ours only."""
        return self.seconds - self.ttft_s if self.ttft_s is not None else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after it; None without a first-token time or a second token."""
        decode = self.decode_s
        return (len(self.tokens) - 1) / decode if decode and decode > 0 and len(self.tokens) > 1 else None


@dataclass
class PromptResult:
    """Every method's runs on one prompt: one run each, more where the prompt was re-run."""

    index: int  # position in the prompt file (after --limit), from 0
    category: str | None
    prompt_tokens: int  # chat-templated prompt length in tokens
    runs: dict[str, list[Run]] = field(default_factory=dict)  # method -> runs, the first round first

    def speedup(self, method: str, base: str) -> float | None:
        """Median over the back-to-back pairs of (method tokens/s / base tokens/s); None if unmeasurable."""
        pairs = list(zip(self.runs.get(method, []), self.runs.get(base, [])))
        ratios = [m.tokens_per_s / b.tokens_per_s for m, b in pairs if b.tokens_per_s > 0]
        return statistics.median(ratios) if ratios else None

    @property
    def reruns(self) -> int:
        """Extra rounds this prompt got (0 when its first ratio was good enough)."""
        return max((len(r) for r in self.runs.values()), default=1) - 1

    def identical(self, method: str, base: str = INCREMENTAL) -> bool:
        """Every run of `method` gave exactly the token ids of every run of `base`."""
        reference = self.runs[base][0].tokens
        return all(r.tokens == reference for r in (*self.runs[method], *self.runs[base]))

    def row(self) -> dict:
        """The report's per-prompt row."""
        methods = {}
        for name, runs in self.runs.items():
            cell = {"tokens_per_s": statistics.median(r.tokens_per_s for r in runs), "new_tokens": len(runs[0].tokens)}
            if runs[0].ttft_s is not None:
                cell["ttft_ms"] = 1000 * runs[0].ttft_s
                if runs[0].decode_tokens_per_s is not None:
                    cell["decode_tokens_per_s"] = runs[0].decode_tokens_per_s
            if name in SPEC_METHODS:
                cell["speedup_vs_incremental"] = self.speedup(name, INCREMENTAL)
                cell["mean_accepted"] = runs[0].tokens_per_step or 0.0
                cell["identical"] = self.identical(name)
            methods[name] = cell
        return {
            "index": self.index,
            "category": self.category,
            "prompt_tokens": self.prompt_tokens,
            "reruns": self.reruns,
            "methods": methods,
        }


def ratio_key(base: str) -> str:
    """'hf-prompt-lookup' -> 'speedup_vs_hf_prompt_lookup', the report's name for ratios over `base`."""
    return f"speedup_vs_{base.replace('-', '_')}"


def geomean(values: list[float]) -> float | None:
    """Geometric mean of positive ratios (None for none)."""
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def ratio_summary(results: list[PromptResult], method: str, base: str) -> dict:
    """geomean, worst prompt and per-category geomeans of method's per-prompt speed-up over base."""
    key = ratio_key(base)
    per_prompt = [(r, r.speedup(method, base)) for r in results]
    per_prompt = [(r, s) for r, s in per_prompt if s is not None]
    if not per_prompt:
        return {}
    worst, worst_ratio = min(per_prompt, key=lambda pair: pair[1])
    categories: dict[str, list[float]] = {}
    for result, ratio in per_prompt:
        categories.setdefault(result.category or UNCATEGORISED, []).append(ratio)
    return {
        f"geomean_{key}": geomean([s for _, s in per_prompt]),
        f"min_{key}": {"speedup": worst_ratio, "index": worst.index, "category": worst.category},
        f"geomean_{key}_by_category": {c: geomean(v) for c, v in sorted(categories.items())},
    }


def method_summary(results: list[PromptResult], name: str, slower_below: float) -> dict:
    """One method over all prompts (first-round runs, so every method weighs the same prompts)."""
    first = [r.runs[name][0] for r in results]
    tokens, seconds = sum(len(r.tokens) for r in first), sum(r.seconds for r in first)
    out = {"tokens_per_s": tokens / seconds if seconds else 0.0, "new_tokens": tokens}
    if name in OURS:
        steps = sum(r.steps for r in first)
        out["mean_accepted"] = tokens / steps if steps else 0.0  # tokens per verifier step, prefill included
        ttfts = [r.ttft_s for r in first if r.ttft_s is not None]
        out["ttft_ms"] = 1000 * statistics.fmean(ttfts) if ttfts else None
        timed = [(result, run) for result, run in zip(results, first) if run.ttft_s]
        after_first = sum(run.decode_s for _, run in timed)
        out["decode_tokens_per_s"] = sum(len(run.tokens) - 1 for _, run in timed) / after_first if after_first > 0 else None
        prefill = sum(run.ttft_s for _, run in timed)
        out["prefill_tokens_per_s"] = sum(result.prompt_tokens for result, _ in timed) / prefill if prefill else None
    if name in SPEC_METHODS:
        spec_steps = sum(r.steps - 1 for r in first)  # the prefill drafts nothing
        out["mean_drafted"] = sum(r.drafted for r in first) / spec_steps if spec_steps else 0.0
        out["identical_outputs"] = sum(r.identical(name) for r in results)
        out["identical_to_hf_generate"] = sum(
            r.runs[name][0].tokens == r.runs["hf-generate"][0].tokens for r in results if "hf-generate" in r.runs
        )
        out["compared_outputs"] = len(results)
        for base in BASES:
            if all(base in r.runs for r in results):
                out.update(ratio_summary(results, name, base))
        out["slower_prompts"] = [
            r.index for r in results if (s := r.speedup(name, INCREMENTAL)) is not None and s < slower_below
        ]
    return out


def summarise(results: list[PromptResult], methods: tuple[str, ...], slower_below: float) -> dict:
    """`methods` and `per_prompt`, the measured part of the report."""
    return {
        "methods": {name: method_summary(results, name, slower_below) for name in methods},
        "per_prompt": [r.row() for r in results],
    }


def _x(value) -> str:
    return f"{value:.2f}x" if value is not None else "n/a"


def format_table(report: dict) -> str:
    """The report as a table for people: one line per method, then the ratios per speculative row."""
    head = (
        f"{'method':<22}{'tokens/s':>9}{'decode':>8}{'tokens/step':>12}{'nodes/step':>11}{'TTFT ms':>9}"
        f"{'vs incr':>9}{'worst (prompt)':>16}{'identical':>11}"
    )
    rows = [head]
    for name, m in report["methods"].items():
        steps = f"{m['mean_accepted']:.2f}" if "mean_accepted" in m else "-"
        nodes = f"{m['mean_drafted']:.2f}" if "mean_drafted" in m else "-"
        ttft = f"{m['ttft_ms']:.0f}" if m.get("ttft_ms") is not None else "-"
        decode = f"{m['decode_tokens_per_s']:.1f}" if m.get("decode_tokens_per_s") is not None else "-"
        geo, worst, same = "-", "-", "-"
        if "geomean_speedup_vs_incremental" in m:
            low = m["min_speedup_vs_incremental"]
            geo, worst = _x(m["geomean_speedup_vs_incremental"]), f"{_x(low['speedup'])} (#{low['index']})"
            same = f"{m['identical_outputs']}/{m['compared_outputs']}"
        rows.append(f"{name:<22}{m['tokens_per_s']:>9.2f}{decode:>8}{steps:>12}{nodes:>11}{ttft:>9}{geo:>9}{worst:>16}{same:>11}")
    rows += [
        "",
        f"model {report['model']} ({report['quant']}, {report['device']}, attention {report['attention_backend']}), "
        f"{report['threads']} torch threads, {report['prompts']} prompts, {report['max_new_tokens']} max new tokens, "
        f"greedy; tree {report['tree']}; order rotated per prompt; tokens/s include the prefill, decode (tokens/s) "
        "counts the tokens after the first over the time after it",
        f"speculators: {', '.join(report['speculators'] or []) or 'none'}",
    ]
    if report.get("linear4bit"):
        rows.append(f"4-bit layers: {report['linear4bit']}")
    if report.get("hf_assistant"):
        rows.append(f"hf-assisted: assistant_model {report['hf_assistant']}")
    rows += [f"{method}: not run: {why}" for method, why in (report.get("not_run") or {}).items()]
    if report.get("thread_switches"):
        rows.append(f"threads: our engine changed its thread count {report['thread_switches']} times: other processes "
                    "held cores, so these are not a quiet machine's figures")
    for name, m in report["methods"].items():
        if "geomean_speedup_vs_incremental" not in m:
            continue
        others = ", ".join(
            f"vs {base} {_x(m[f'geomean_{ratio_key(base)}'])}" for base in BASES[1:] if f"geomean_{ratio_key(base)}" in m
        )
        rows.append(f"{name}: geomean {_x(m['geomean_speedup_vs_incremental'])} vs incremental; {others}")
        categories = m["geomean_speedup_vs_incremental_by_category"]
        if set(categories) != {UNCATEGORISED}:
            rows.append("    by category: " + ", ".join(f"{c} {_x(v)}" for c, v in categories.items()))
        slower = m["slower_prompts"]
        rows.append(
            f"    slower than incremental (< {report['rerun_below']}x) on {len(slower)}/{m['compared_outputs']} prompts"
            + (f": {', '.join(f'#{i}' for i in slower)}" if slower else "")
        )
    reran = sum(1 for row in report["per_prompt"] if row["reruns"])
    if reran:
        rows.append(f"{reran} prompt(s) re-run for {DEFAULT_SPEC} (median of {report['rerun_total']} ratios counted)")
    return "\n".join(rows)
