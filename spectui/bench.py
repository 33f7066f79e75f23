"""`spectui bench`: every decoding method on the same prompts, greedy, in one process.

It is built to prove or disprove "adaptive speculation is never slower than incremental
decoding, and faster where drafts agree" (the report and its ratios: bench_report.py).

Methods (same verifier, same prompts, same max new tokens; ids as in the JSON report):
    incremental        ours, one token per verifier step (settings.speculate=False, --no-spec)
    hf-generate        transformers' generate(do_sample=False)
    hf-prompt-lookup   transformers' generate with prompt_lookup_num_tokens=10
    hf-assisted        transformers' assisted generation, assistant_model = the biggest SSM of the
                       preset (most parameters; a feature head is none), else of its extra SSMs
                       (Preset.extra_ssms: made for the verifier, not drafted by default), loaded
                       beside the engine for this row only; only when there is one; with its dynamic draft
                       length switched on as far as transformers 5 allows: on the assistant's
                       generation_config, num_assistant_tokens_schedule="heuristic" (+2 draft
                       tokens after a fully accepted draft, -1 otherwise; carried over between
                       calls) and assistant_confidence_threshold=0.4 (a draft stops early below
                       that assistant probability; transformers re-fits the threshold online only
                       when scikit-learn is installed)
    speculative-fixed  ours, the fixed tree (1,1,1): the default before the adaptive tree
    speculative        ours, the --tree value (default: the engine's default, "auto"), union merge
    speculative-pipelined  the same, with the SSM drafting ahead while the verifier runs
                       (engine/pipeline.py): off by default unless this row wins; only when a
                       speculator can draft ahead (an SSM: a feature head needs the verifier's features
                       of the branch), else the report's `not_run` says why
    speculative-vote   the same tree merged by vote, when --merge is vote or both

Protocol, so that noise hits every method alike:
    - torch runs every method with the same thread count (all cores unless --threads);
    - one warm-up call of each method first (allocation, lazy initialisation, cost measurement);
    - per prompt the methods run back to back, the order rotated: prompt k starts at method
      k mod n (`rotation`), so no method always runs first or right after another;
    - a prompt where `speculative` comes out under 0.95x incremental, or above its own tokens per
      verifier step (which no real run can reach: see `reruns_needed`), is measured again, the
      pair back to back and rotated, 3 times in all, and the median ratio counts.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from .bench_report import DEFAULT_SPEC, INCREMENTAL, PromptResult, Run, format_table, summarise  # noqa: F401
from .engine import GenerationSettings, encode_chat, read_prompt_file, tree_text

MERGE_CHOICES = ("union", "vote", "both")
FIXED_TREE = (1, 1, 1)  # the speculative-fixed row: the default tree before `auto`
PROMPT_LOOKUP_TOKENS = 10  # hf-prompt-lookup's candidate length
ASSISTANT_SCHEDULE = "heuristic"  # hf-assisted: transformers' dynamic number of draft tokens
ASSISTANT_CONFIDENCE = 0.4  # hf-assisted: stop a draft below this assistant probability
RERUN_BELOW = 0.95  # a `speculative` ratio under this re-measures the prompt ...
RERUN_TOTAL = 3  # ... until it has this many ratios; their median counts


def merge_policies(choice: str) -> tuple[str, ...]:
    """--merge union|vote|both -> the merge policies the speculative rows use."""
    if choice not in MERGE_CHOICES:
        raise ValueError(f"--merge must be union, vote or both, not {choice!r}")
    return ("union", "vote") if choice == "both" else (choice,)


def bench_methods(has_assistant: bool, can_prefetch: bool, policies: tuple[str, ...]) -> tuple[str, ...]:
    """The method ids in report order: baselines, then ours with speculation. has_assistant: an SSM for
    hf-assisted; can_prefetch: a speculator that can draft ahead (engine/pipeline.py)."""
    methods = [INCREMENTAL, "hf-generate", "hf-prompt-lookup"]
    methods += ["hf-assisted"] if has_assistant else []
    methods += ["speculative-fixed", DEFAULT_SPEC]
    methods += ["speculative-pipelined"] if can_prefetch else []
    methods += ["speculative-vote"] if "vote" in policies else []
    return tuple(methods)


def not_run(methods: tuple[str, ...]) -> dict[str, str]:
    """Why a method of the full set is missing from this bench (the report's `not_run`)."""
    why = {"hf-assisted": "no SSM that transformers can take as its assistant (a feature head is not one)",
           "speculative-pipelined": "no speculator that can draft ahead (a feature head needs the verifier's features of the branch)"}
    return {method: reason for method, reason in why.items() if method not in methods}


def rotation(methods: tuple[str, ...], k: int) -> tuple[str, ...]:
    """The order prompt k runs the methods in: starting at method k mod n, wrapping around."""
    start = k % len(methods)
    return (*methods[start:], *methods[:start])


def reruns_needed(first_ratio: float | None, tokens_per_step: float | None = None) -> int:
    """Extra rounds for a prompt whose first `speculative` / incremental ratio is `first_ratio`.

    Under RERUN_BELOW, or above `tokens_per_step` (the speculative run's tokens per verifier step,
    prefill included), the prompt is measured RERUN_TOTAL times in all, whatever the later rounds
    give (stopping at the first good one would bias the median). The upper bound is physical: with
    N tokens in S verifier passes, incremental takes the prefill P plus N - 1 one-token steps of c1,
    speculative at least P plus S - 1 steps of c1 (a step verifies one token or more, and drafts),
    so the ratio is at most (P + (N - 1) c1) / (P + (S - 1) c1) <= N / S, as P >= c1. A ratio above it
    says the incremental run stalled: a flattering figure to measure again, as a low one is.
    """
    if first_ratio is None:
        return 0
    high = tokens_per_step is not None and first_ratio > tokens_per_step
    return RERUN_TOTAL - 1 if first_ratio < RERUN_BELOW or high else 0


def set_threads(threads: int | None) -> int:
    """torch's intra-op thread count for every method: `threads`, or all cores; returns it."""
    count = threads or os.cpu_count() or 1
    torch.set_num_threads(count)
    return count


class Prompt(str):
    """A prompt's text (it is the str, so callers wanting text need nothing else) and its category."""

    category: str | None

    def __new__(cls, text: str, category: str | None = None):
        self = super().__new__(cls, text)
        self.category = category
        return self


def read_prompts(path: Path, limit: int | None, per_category: int | None = None) -> list[Prompt]:
    """A prompts file (engine/prompt_files.py: JSONL with 'turns', 'prompt' or 'text' and an optional
    'category', or one prompt per line) as Prompts.

    per_category: keep the first N prompts of each category (file order kept), then `limit` applies.
    """
    prompts = [Prompt(text, category) for text, category in read_prompt_file(path)]  # PromptFileError if bad
    if per_category:
        seen: dict[str | None, int] = {}
        kept = []
        for prompt in prompts:
            seen[prompt.category] = seen.get(prompt.category, 0) + 1
            if seen[prompt.category] <= per_category:
                kept.append(prompt)
        prompts = kept
    return prompts[:limit] if limit else prompts


def causal_lms(ssms: list[tuple[str, object]]) -> list[tuple[str, object]]:
    return [pair for pair in ssms if hasattr(pair[1], "num_parameters")]


class Bench:
    """Runs one method on one prompt and times it."""

    def __init__(self, models, engine, run_settings: GenerationSettings, models_dir=None):
        """run_settings: the RunSpec's; every method runs greedy with its max_new_tokens, ours with its tree.
        models_dir: the model cache, where the preset's extra SSMs are found for hf-assisted."""
        self.models, self.engine = models, engine
        tree, max_new_tokens = run_settings.tree_shape, run_settings.max_new_tokens
        base = GenerationSettings(max_new_tokens=max_new_tokens, temperature=0.0)
        self.settings = {  # our methods' settings; detail stays off (no tree text per event)
            INCREMENTAL: replace(base, speculate=False),
            "speculative-fixed": replace(base, tree_shape=FIXED_TREE, merge="union"),
            DEFAULT_SPEC: replace(base, tree_shape=tree, merge="union"),
            "speculative-pipelined": replace(base, tree_shape=tree, merge="union", pipeline=True),
            "speculative-vote": replace(base, tree_shape=tree, merge="vote"),
        }
        self.max_new_tokens = max_new_tokens
        self.stop_ids = models.stop_token_ids()
        causal = causal_lms(models.ssms)  # assisted generation takes an LM, not a feature head
        if not causal:  # the preset drafts with none: an SSM made for its verifier, for this peer only
            from .engine import load_ssm

            extra = [load_ssm(s, models.verifier, models.tokenizer, models.device, models_dir) for s in models.preset.extra_ssms]
            causal = causal_lms(extra)
        named = max(causal, key=lambda pair: pair[1].num_parameters(), default=None)
        self.assistant_name, self.assistant = named if named else (None, None)
        if self.assistant is not None:  # transformers reads these from the assistant's own config
            self.assistant.generation_config.num_assistant_tokens_schedule = ASSISTANT_SCHEDULE
            self.assistant.generation_config.assistant_confidence_threshold = ASSISTANT_CONFIDENCE

    def prompt_ids(self, prompt: str) -> list[int]:
        return encode_chat(self.models.tokenizer, [{"role": "user", "content": str(prompt)}], self.models.chat_template)

    def run_engine(self, ids: list[int], settings: GenerationSettings) -> Run:
        tokens, steps, drafted, ttft = [], 0, 0, None
        start = time.perf_counter()
        for event in self.engine.generate(ids, settings):  # one event per verifier step, step 0 the prefill
            if ttft is None:
                ttft = time.perf_counter() - start
            tokens += event.new_tokens
            steps += 1
            drafted += event.drafted
        return Run(tokens, time.perf_counter() - start, steps, drafted, ttft)

    @torch.inference_mode()
    def run_hf(self, ids: list[int], method: str) -> Run:
        inputs = torch.tensor([ids], device=self.models.verifier.device)  # [1, prompt tokens]
        kwargs = dict(max_new_tokens=self.max_new_tokens, do_sample=False, eos_token_id=self.stop_ids)
        kwargs["pad_token_id"] = self.stop_ids[0] if self.stop_ids else None
        if method == "hf-prompt-lookup":
            kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
        elif method == "hf-assisted":
            kwargs["assistant_model"] = self.assistant
        start = time.perf_counter()
        out = self.models.verifier.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)  # [1, all tokens]
        return Run(out[0, len(ids) :].tolist(), time.perf_counter() - start)

    def run(self, method: str, ids: list[int]) -> Run:
        if method in self.settings:
            return self.run_engine(ids, self.settings[method])
        return self.run_hf(ids, method)


def engine_models(engine) -> dict:
    """The engine's cost model and acceptance calibration, where this engine has them."""
    costs = getattr(engine, "cost_model", None)
    acceptance = getattr(engine, "acceptance_model", None)
    return {
        "cost_model": costs.to_dict() if callable(getattr(costs, "to_dict", None)) else None,
        "calibration": acceptance.calibration() if callable(getattr(acceptance, "calibration", None)) else None,
    }


def measure_prompt(bench: Bench, methods: tuple[str, ...], k: int, prompt: str) -> PromptResult:
    """Prompt k: every method once in rotated order, then the re-runs `speculative` needs."""
    ids = bench.prompt_ids(prompt)
    result = PromptResult(k, getattr(prompt, "category", None), len(ids), {m: [] for m in methods})
    for method in rotation(methods, k):
        result.runs[method].append(bench.run(method, ids))
    tokens_per_step = result.runs[DEFAULT_SPEC][0].tokens_per_step
    for extra in range(1, reruns_needed(result.speedup(DEFAULT_SPEC, INCREMENTAL), tokens_per_step) + 1):
        for method in rotation((INCREMENTAL, DEFAULT_SPEC), k + extra):
            result.runs[method].append(bench.run(method, ids))
    return result


def run_bench(
    models, engine, prompts: list[str], run_settings: GenerationSettings, progress=None, merge: str = "both",
    threads: int | None = None, models_dir=None,
) -> dict:
    """Warm up, measure every prompt, return the report (its keys: bench_report.py's docstring).
    run_settings: the RunSpec's (max_new_tokens, and the tree of the speculative rows)."""
    policies = merge_policies(merge)
    threads = set_threads(threads)
    bench = Bench(models, engine, run_settings, models_dir)
    max_new_tokens, tree = run_settings.max_new_tokens, run_settings.tree_shape
    methods = bench_methods(bench.assistant is not None, any(hasattr(d, "prefetch") for d in engine.drafters), policies)
    warm = bench.prompt_ids("Hello")
    for method in methods:  # first calls pay for allocation, lazy initialisation and cost measurement
        bench.run(method, warm)
    results = []
    switches_before = engine.thread_switches
    for k, prompt in enumerate(prompts):
        results.append(measure_prompt(bench, methods, k, prompt))
        if progress:
            progress(k + 1, len(prompts))
    return {
        "model": models.preset.name,
        "ssms": [name for name, _ in models.ssms],
        "speculators": list(engine.speculator_names),
        "quant": models.quant,
        "device": models.device,
        "attention_backend": models.attention_backend,
        "linear4bit": getattr(models.verifier, "spectui_4bit", None),  # how the 4-bit layers compute
        "threads": threads,
        "thread_switches": engine.thread_switches - switches_before,  # > 0: other processes held cores (threads.py)
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "tree": tree_text(tree),
        "fixed_tree": tree_text(FIXED_TREE),
        "merge": list(policies),
        "hf_assistant": bench.assistant_name,
        "not_run": not_run(methods),
        "order": "rotated",
        "rerun_below": RERUN_BELOW,
        "rerun_total": RERUN_TOTAL,
        **summarise(results, methods, RERUN_BELOW),
        **engine_models(engine),
    }
