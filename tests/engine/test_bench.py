"""`spectui bench`: the measuring protocol (rotation, re-runs), the summaries, and the CLI end to end.

The pure parts are tested on hand-made runs whose ratios are known; the CLI runs a tiny random
LLaMA verifier (tests/engine/conftest.py) for one or two prompts and a few tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spectui.bench import (
    RERUN_BELOW,
    RERUN_TOTAL,
    Bench,
    Prompt,
    bench_methods,
    merge_policies,
    not_run,
    read_prompts,
    reruns_needed,
    rotation,
)
from spectui.bench_report import PromptResult, Run, format_table, geomean, summarise
from spectui.engine import GenerationSettings, PromptFileError, RunSpec

SPECTUI = [sys.executable, "-m", "spectui.cli"]
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "vicuna_bench_questions.jsonl"


def spectui(*args, timeout=300):
    return subprocess.run([*SPECTUI, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy())


def run(tokens_per_s: float, tokens=(1, 2, 3, 4), steps=4) -> Run:
    """A run of `tokens` that took exactly len(tokens) / tokens_per_s seconds."""
    return Run(list(tokens), len(tokens) / tokens_per_s, steps=steps, drafted=2 * (steps - 1), ttft_s=0.01)


# --------------------------------------------------------------------------- protocol


def test_rotation_starts_prompt_k_at_method_k_mod_n():
    methods = ("a", "b", "c")
    assert rotation(methods, 0) == ("a", "b", "c")
    assert rotation(methods, 1) == ("b", "c", "a")
    assert rotation(methods, 2) == ("c", "a", "b")
    assert rotation(methods, 4) == ("b", "c", "a")
    firsts = [rotation(methods, k)[0] for k in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]  # every method leads equally often


def test_methods_depend_on_assistant_and_merge():
    assert merge_policies("both") == ("union", "vote")
    assert merge_policies("vote") == ("vote",) and merge_policies("union") == ("union",)
    with pytest.raises(ValueError, match="union, vote or both"):
        merge_policies("intersection")
    base = ("incremental", "hf-generate", "hf-prompt-lookup", "speculative-fixed", "speculative")
    assert bench_methods(False, False, ("union",)) == base
    with_all = bench_methods(True, True, ("union", "vote"))
    assert "hf-assisted" in with_all and with_all[-1] == "speculative-vote"
    assert "speculative-pipelined" in with_all and "speculative-pipelined" not in base  # only with SSMs
    assisted_only = bench_methods(True, False, ("union",))  # a feature head drafts, an extra SSM assists
    assert "hf-assisted" in assisted_only and "speculative-pipelined" not in assisted_only
    assert set(not_run(assisted_only)) == {"speculative-pipelined"} and set(not_run(base)) == {"hf-assisted", "speculative-pipelined"}
    assert not_run(with_all) == {}


def test_assistant_comes_from_the_presets_extra_ssms(tiny_dirs):
    """A preset that drafts with no SSM transformers can take (the embedded default drafts with a feature
    head) lends hf-assisted one of its extra SSMs, the biggest; the engine itself does not draft with it."""
    from spectui.engine.loading import build_engine, load_models
    from spectui.engine.presets import Preset

    preset = Preset(name="t", verifier=str(tiny_dirs["verifier"]), extra_ssms=(str(tiny_dirs["ssm68"]),))
    models = load_models(preset, quant="none", device="cpu")
    engine = build_engine(models)
    assert models.ssms == [] and engine.speculator_names == ["ngram"]
    bench = Bench(models, engine, GenerationSettings(max_new_tokens=2))
    assert bench.assistant_name == "ssm68" and bench.assistant.num_parameters() > 0
    assert engine.speculator_names == ["ngram"]  # lent to the peer only
    assert Bench(load_models(Preset(name="u", verifier=str(tiny_dirs["verifier"])), quant="none", device="cpu"),
                 engine, GenerationSettings(max_new_tokens=2)).assistant is None


def test_rerun_rule_and_median_of_ratios():
    assert reruns_needed(0.5) == RERUN_TOTAL - 1 == 2
    assert reruns_needed(RERUN_BELOW - 1e-6) == 2
    assert reruns_needed(RERUN_BELOW) == 0 and reruns_needed(1.3) == 0 and reruns_needed(None) == 0
    # above its own tokens per step no run can be: the incremental one stalled, measure again
    assert reruns_needed(2.4, tokens_per_step=1.1) == 2 and reruns_needed(1.3, tokens_per_step=1.5) == 0
    assert reruns_needed(None, tokens_per_step=1.1) == 0
    # three back-to-back pairs with ratios 0.8, 1.1, 1.0: the median, 1.0, counts
    result = PromptResult(0, None, 10, {
        "incremental": [run(10.0), run(10.0), run(20.0)],
        "speculative": [run(8.0), run(11.0), run(20.0)],
        "speculative-fixed": [run(5.0)],
    })
    assert result.speedup("speculative", "incremental") == pytest.approx(1.0)
    assert result.speedup("speculative-fixed", "incremental") == pytest.approx(0.5)  # first pair only
    assert result.reruns == 2
    row = result.row()
    assert row["reruns"] == 2 and row["methods"]["speculative"]["speedup_vs_incremental"] == pytest.approx(1.0)
    assert row["methods"]["speculative"]["tokens_per_s"] == pytest.approx(11.0)  # median of its runs


# --------------------------------------------------------------------------- summaries


def hand_made_results() -> list[PromptResult]:
    """Three prompts, speculative/incremental ratios 2.0, 0.5 and 1.0; hf-generate ratios 4.0, 1.0, 1.0."""
    rows = [(10.0, 20.0, 5.0, "a"), (10.0, 5.0, 5.0, "b"), (10.0, 10.0, 10.0, None)]  # incr, spec, hf, category
    results = []
    for k, (inc, spec, hf, category) in enumerate(rows):
        results.append(PromptResult(k, category, 20 + k, {
            "incremental": [run(inc, steps=4)],
            "hf-generate": [run(hf)],
            "hf-prompt-lookup": [run(hf)],
            "speculative": [run(spec, steps=2, tokens=(1, 2, 3, 4) if k != 2 else (1, 2, 3, 9))],
        }))
    return results


def test_summary_geomean_min_and_categories():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0) and geomean([]) is None
    methods = ("incremental", "hf-generate", "hf-prompt-lookup", "speculative")
    summary = summarise(hand_made_results(), methods, slower_below=0.95)
    spec = summary["methods"]["speculative"]
    assert spec["geomean_speedup_vs_incremental"] == pytest.approx(1.0)  # (2 * 0.5 * 1) ** (1/3)
    assert spec["min_speedup_vs_incremental"] == {"speedup": pytest.approx(0.5), "index": 1, "category": "b"}
    assert spec["geomean_speedup_vs_incremental_by_category"] == {
        "a": pytest.approx(2.0), "b": pytest.approx(0.5), "uncategorised": pytest.approx(1.0),
    }
    assert spec["geomean_speedup_vs_hf_generate"] == pytest.approx(4 ** (1 / 3))
    assert spec["min_speedup_vs_hf_prompt_lookup"]["speedup"] == pytest.approx(1.0)
    assert spec["slower_prompts"] == [1]
    assert spec["identical_outputs"] == 2 and spec["compared_outputs"] == 3  # prompt 2's tokens differ
    assert spec["mean_accepted"] == pytest.approx(2.0) and spec["ttft_ms"] == pytest.approx(10.0)
    assert summary["methods"]["incremental"]["mean_accepted"] == pytest.approx(1.0)
    incr = summary["methods"]["incremental"]  # three runs of 4 tokens in 0.4 s, the first after 0.01 s
    assert incr["decode_tokens_per_s"] == pytest.approx(9 / (3 * 0.39))
    assert incr["prefill_tokens_per_s"] == pytest.approx((20 + 21 + 22) / 0.03)
    assert "decode_tokens_per_s" not in summary["methods"]["hf-generate"]  # transformers' methods: no first-token time
    rows = summary["per_prompt"]
    assert [r["category"] for r in rows] == ["a", "b", None] and rows[2]["prompt_tokens"] == 22
    assert rows[0]["methods"]["speculative"]["speedup_vs_incremental"] == pytest.approx(2.0)
    assert rows[0]["methods"]["speculative"]["decode_tokens_per_s"] == pytest.approx(3 / (4 / 20.0 - 0.01))
    assert rows[2]["methods"]["speculative"]["identical"] is False
    assert "speedup_vs_incremental" not in rows[0]["methods"]["hf-generate"]


# --------------------------------------------------------------------------- prompts


def test_read_prompts_keeps_categories(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"turns": ["one?"], "category": "math"}\n\n{"turns": ["two?", "later"]}\n')
    prompts = read_prompts(path, None)
    assert prompts == ["one?", "two?"] and [p.category for p in prompts] == ["math", None]
    assert isinstance(prompts[0], str)  # callers wanting text (tui-bench) need nothing else
    text = tmp_path / "p.txt"
    text.write_text("hello there\nsecond\n")
    assert [(p, p.category) for p in read_prompts(text, 1)] == [("hello there", None)]
    (tmp_path / "bad.jsonl").write_text('{"question": "no turns"}\n')
    with pytest.raises(PromptFileError, match="line 1"):
        read_prompts(tmp_path / "bad.jsonl", None)


def test_bench_and_tune_read_prompt_files_one_way(tmp_path):
    from spectui.engine.tune import TuneConfigError, read_prompt_file

    mixed = tmp_path / "m.jsonl"
    mixed.write_text('{"prompt": "a"}\n{"text": "b", "category": "c"}\nplain line\n{"turns": ["d"]}\n')
    assert [(p, p.category) for p in read_prompts(mixed, None)] == [("a", None), ("b", "c"), ("plain line", None), ("d", None)]
    assert read_prompt_file(mixed) == ["a", "b", "plain line", "d"]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"question": "no prompt"}\n')
    with pytest.raises(PromptFileError, match="line 2: expected 'prompt', 'text' or a 'turns' list"):
        read_prompts(tmp_path / "bad.jsonl", None)
    with pytest.raises(TuneConfigError, match="line 2: expected 'prompt', 'text' or a 'turns' list"):
        read_prompt_file(tmp_path / "bad.jsonl")


def test_read_prompts_vicuna_categories():
    prompts = read_prompts(DATA, limit=3)
    assert prompts[0] == "How can I improve my time management skills?" and len(prompts) == 3
    assert prompts[0].category == "generic"
    assert Prompt("x", "c").category == "c"


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def chat_verifier(tiny_dirs, embedded_dir, tmp_path_factory) -> Path:
    """The tiny verifier folder with the embedded model's chat template (the bench sends chat prompts)."""
    folder = tmp_path_factory.mktemp("bench") / "verifier"
    shutil.copytree(tiny_dirs["verifier"], folder)
    shutil.copy(embedded_dir / "chat_template.jinja", folder / "chat_template.jinja")
    return folder


@pytest.fixture
def torch_threads():
    """torch's thread count as it was before the test (bench --threads sets it for the process)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_cli_bench_writes_report(chat_verifier, tmp_path, torch_threads):
    """In process (Typer's CliRunner); the slow tests below run `spectui bench` as a real process."""
    from typer.testing import CliRunner

    from spectui.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["Repeat: red green blue red green blue"], "category": "repeat"}\n{"turns": ["Hi"]}\n')
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, [
        "bench", "--model", str(chat_verifier), "--quant", "none", "--prompts", str(prompts), "--limit", "1",
        "--max-new-tokens", "4", "--threads", "1", "--merge", "union", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["threads"] == 1 and report["prompts"] == 1 and report["max_new_tokens"] == 4
    assert report["tree"] == "auto" and report["fixed_tree"] == "1,1,1" and report["hf_assistant"] is None
    assert list(report["methods"]) == ["incremental", "hf-generate", "hf-prompt-lookup", "speculative-fixed", "speculative"]
    assert {"cost_model", "calibration", "per_prompt", "rerun_below", "rerun_total"} <= set(report)
    assert report["linear4bit"] is None  # --quant none: no 4-bit layers to name
    for name in ("speculative-fixed", "speculative"):
        m = report["methods"][name]
        assert m["identical_outputs"] == 1 and m["identical_to_hf_generate"] == 1, name
        assert m["geomean_speedup_vs_incremental"] > 0 and m["min_speedup_vs_incremental"]["index"] == 0
        assert set(m["geomean_speedup_vs_incremental_by_category"]) == {"repeat"}
        assert m["geomean_speedup_vs_hf_generate"] > 0 and m["geomean_speedup_vs_hf_prompt_lookup"] > 0
        assert m["ttft_ms"] > 0 and m["mean_accepted"] >= 1.0
    (row,) = report["per_prompt"]
    assert row["index"] == 0 and row["category"] == "repeat" and row["prompt_tokens"] > 5
    assert row["methods"]["speculative"]["identical"] is True and row["reruns"] in (0, RERUN_TOTAL - 1)
    assert all(cell["new_tokens"] == 4 for cell in row["methods"].values())
    assert "speculative" in result.stdout and "vs incremental" in result.stdout  # the table
    assert set(report["not_run"]) == {"hf-assisted", "speculative-pipelined"}  # a model alone: no SSM to assist or run ahead
    assert "speculative-pipelined: not run: no speculator that can draft ahead" in result.stdout
    assert "per_prompt" not in format_table(report)
    assert report["thread_switches"] == 0 and "not a quiet machine" not in format_table(report)  # one thread: none
    assert "changed its thread count 2 times" in format_table({**report, "thread_switches": 2})


@pytest.mark.slow
def test_cli_bench_json_stdout_with_vote_and_fixed_tree(chat_verifier, tmp_path):
    """--json - puts the table on stderr; --tree sets the speculative row; --merge both adds the vote row."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("Count: 1 2 3 1 2 3\n")
    result = spectui(
        "bench", "--model", str(chat_verifier), "--quant", "none", "--prompts", str(prompts),
        "--max-new-tokens", "3", "--tree", "2,1", "--json", "-",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tree"] == "2,1" and report["merge"] == ["union", "vote"]
    assert report["methods"]["speculative-vote"]["identical_outputs"] == 1
    assert report["per_prompt"][0]["category"] is None
    assert report["threads"] == os.cpu_count()  # all cores by default
    assert "speculative-vote" in result.stderr


def test_run_bench_reruns_a_slow_prompt_in_process(chat_verifier, monkeypatch):
    """With the re-run threshold raised beyond any ratio, the prompt is measured RERUN_TOTAL times."""
    import torch

    import spectui.bench as bench
    from spectui.engine.loading import load_engine

    monkeypatch.setattr(bench, "RERUN_BELOW", 1e9)
    before = torch.get_num_threads()
    try:
        models, engine = load_engine(RunSpec(str(chat_verifier), quant="none", device="cpu"))
        report = bench.run_bench(models, engine, [Prompt("Hi", "greeting")], GenerationSettings(max_new_tokens=2, tree_shape=(1,)),
                                 merge="union", threads=1)
    finally:
        torch.set_num_threads(before)
    (row,) = report["per_prompt"]
    assert row["reruns"] == RERUN_TOTAL - 1 and row["category"] == "greeting"
    assert report["threads"] == 1 and report["tree"] == "1" and report["rerun_below"] == 1e9
    assert report["methods"]["speculative"]["identical_outputs"] == 1
    assert report["methods"]["speculative"]["slower_prompts"] == [0]  # every ratio is under 1e9


def test_per_category_sample_keeps_file_order(tmp_path):
    from spectui.bench import read_prompts

    path = tmp_path / "p.jsonl"
    rows = [("a", "x1"), ("a", "x2"), ("b", "y1"), ("a", "x3"), ("b", "y2"), ("b", "y3")]
    path.write_text("\n".join(json.dumps({"category": c, "turns": [t]}) for c, t in rows) + "\n", encoding="utf-8")
    picked = read_prompts(path, None, per_category=2)
    assert [str(p) for p in picked] == ["x1", "x2", "y1", "y2"]
    assert [p.category for p in picked] == ["a", "a", "b", "b"]
