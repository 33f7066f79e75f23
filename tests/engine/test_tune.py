"""`spectui tune` end to end at tiny scale: a tiny random LLaMA verifier, 3 prompts, ~250 answer tokens.

The run goes through the real CLI (Typer's CliRunner, in process), then the SSM folders are loaded
the way `spectui chat --ssm` loads them, and the engine's greedy output with them must equal
incremental decoding. Resume is checked for exactness: training interrupted mid-way and resumed
from its checkpoint ends with the very weights of the uninterrupted run.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from spectui.cli import app
from spectui.engine.chat import encode_chat
from spectui.engine.loading import build_engine, load_models
from spectui.engine.presets import resolve_model
from spectui.engine.settings import GenerationSettings
from spectui.engine.tune.config import TuneConfig
from spectui.engine.tune.magpie import Deduper, normalise, synthesise
from spectui.engine.tune.pipeline import run_tune

from tiny_models import assert_same_weights

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]
# A tiny SSM and a tiny run; every flag is a real CLI option.
TUNE_ARGS = [
    "--tokens", "250", "--max-answer-tokens", "40", "--batch-size", "4", "--hidden", "32", "--layers", "1",
    "--epochs", "3", "--batch-tokens", "128", "--checkpoint-every", "2", "--quant", "none", "--device", "cpu",
    "--threads", "2",
]


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, tiny_verifier) -> Path:
    root = tmp_path_factory.mktemp("tuned")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    out = root / "out"
    result = run_cli("tune", "--model", str(tiny_verifier), "--prompts", str(prompts), "--out", str(out), *TUNE_ARGS)
    assert result.exit_code == 0, result.output
    assert f"--ssm {out / 'ssm-1'} --ssm {out / 'ssm-2'}" in result.stdout
    return out


def test_tune_writes_small_loadable_ssm_folders(tuned, tiny_verifier):
    for k in (1, 2):
        folder = tuned / f"ssm-{k}"
        names = {p.name for p in folder.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
        assert "checkpoint.pt" not in names  # removed once the SSM is finished (no --keep-checkpoints)
        assert sum(p.stat().st_size for p in folder.iterdir()) < 20e6
        config = json.loads((folder / "config.json").read_text())
        assert config["hidden_size"] == 32 and config["num_hidden_layers"] == 1 and config["tie_word_embeddings"]
        assert {t.dtype for t in load_file(folder / "model.safetensors").values()} == {torch.bfloat16}
    shards = sorted((tuned / "data").glob("shard-*.jsonl"))
    data = [json.loads(line) for shard in shards for line in shard.read_text().splitlines()]
    assert sum(len(row["answer_ids"]) for row in data) >= 250
    assert {row["mode"] for row in data} == {"greedy", "sample"}  # first pass greedy, the cycled passes sampled
    assert {row["prompt"] for row in data} == set(PROMPTS)
    assert (tuned / "tune.log").read_text().count("checkpoint saved") >= 2


def test_engine_accepts_tuned_ssms_and_stays_lossless(tuned, tiny_verifier):
    ssms = (str(tuned / "ssm-1"), str(tuned / "ssm-2"))
    models = load_models(resolve_model(str(tiny_verifier)), ssms, quant="none", device="cpu")
    assert [name for name, _ in models.ssms] == ["ssm-1", "ssm-2"]  # the vocabulary check passed
    engine = build_engine(models, ngram=False)
    template = models.chat_template
    drafted = 0
    for prompt in PROMPTS[:2]:
        ids = encode_chat(models.tokenizer, [{"role": "user", "content": prompt}], template)  # as engine.chat renders it
        runs = {}
        for speculate in (True, False):
            settings = GenerationSettings(max_new_tokens=24, speculate=speculate, tree_shape=(2, 2, 1), detail=True)
            events = list(engine.generate(list(ids), settings))
            runs[speculate] = [t for e in events for t in e.new_tokens]
            if speculate:
                drafted += sum(e.drafted for e in events)
                assert {s for e in events for node in e.tree for s in node.sources} == {"ssm-1", "ssm-2"}
        assert runs[True] == runs[False], f"speculation with tuned SSMs changed the output for {prompt!r}"
    assert drafted > 0


def test_report_has_agreement_per_ssm_and_together(tuned):
    report = json.loads((tuned / "report.json").read_text())
    assert [s["name"] for s in report["ssms"]] == ["ssm-1", "ssm-2"]
    assert report["data"]["held_out_positions"] > 0
    together = report["together"]["all"]
    for entry in report["ssms"]:
        scores = entry["agreement"]["all"]
        assert 0 <= scores["top1"] <= scores["top3"] <= 1
        assert together["top1"] >= scores["top1"] and together["top3"] >= scores["top3"]
        assert entry["train"]["steps"] >= 2
        assert entry["train"]["final_loss"] < math.log(49152)  # better than a uniform guess: it learned
    assert report["throughput"]["answer_tokens_per_s"] > 0


def test_resume_continues_training_exactly_from_the_checkpoint(tuned, tiny_verifier, tmp_path):
    """Interrupt SSM 2 after step 2 (a checkpoint), resume: the weights equal the uninterrupted run's."""
    out = tmp_path / "out"
    shutil.copytree(tuned, out, ignore=shutil.ignore_patterns("ssm-2", "report.json", "tune.log"))
    shard_times = {p.name: p.stat().st_mtime_ns for p in (out / "data").iterdir()}
    cfg = replace(
        TuneConfig(), out=out, model=str(tiny_verifier), prompts_file=tuned.parent / "prompts.txt", tokens=250,
        max_answer_tokens=40, batch_size=4, magpie_batch=4, hidden=32, layers=1, epochs=3, batch_tokens=128,
        checkpoint_every=2, quant="none", device="cpu", threads=2, resume=True,  # = TUNE_ARGS
    )

    class Interrupted(Exception):
        pass

    def interrupt(ssm: int, step: int, loss: float) -> None:
        if ssm == 2 and step == 3:  # after the checkpoint of step 2 and one more step that is lost
            raise Interrupted

    with pytest.raises(Interrupted):
        run_tune(cfg, after_step=interrupt)
    assert torch.load(out / "ssm-2" / "checkpoint.pt", weights_only=True)["step"] == 2  # plain types: no code runs
    assert not (out / "ssm-2" / "model.safetensors").exists()

    run_tune(cfg)
    assert "ssm-2: resuming from the checkpoint at step 2/" in (out / "tune.log").read_text()
    assert "ssm-1: finished earlier" in (out / "tune.log").read_text()
    assert {p.name: p.stat().st_mtime_ns for p in (out / "data").iterdir()} == shard_times  # no answer regenerated
    assert_same_weights(out / "ssm-2" / "model.safetensors", tuned / "ssm-2" / "model.safetensors")


def test_magpie_on_the_tiny_verifier_returns_distinct_prompts(tiny_verifier):
    models = load_models(resolve_model(str(tiny_verifier)), quant="none", device="cpu")
    # A random model never ends its turn and writes word salad: accept unfinished samples here.
    cfg = replace(TuneConfig(), magpie_batch=4, magpie_max_tokens=10, magpie_require_end=False, seed=3)
    kept: list[str] = []
    seen = Deduper(["an old prompt"])
    template, stop_ids = models.chat_template, models.stop_token_ids()
    count = synthesise(models.verifier, models.tokenizer, template, stop_ids, 6, cfg, seen, kept.append)
    assert count == len(kept) == 6
    assert len({normalise(t) for t in kept}) == 6 and "an old prompt" not in kept
    assert all(cfg.min_prompt_chars <= len(t) <= cfg.max_prompt_chars and "<|im_" not in t for t in kept)


def test_bad_quant_for_a_real_model_writes_nothing(tiny_verifier, tmp_path):
    result = run_cli("tune", "--model", str(tiny_verifier), "--out", str(tmp_path / "out"), "--quant", "bogus")
    assert result.exit_code == 2 and "--quant 'bogus'" in result.stderr
    assert not (tmp_path / "out").exists()  # was: OUT/tune.log and tune-config.json, then the error


def test_unusable_prompts_file_exits_2_before_writing(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"no prompt here": 1}\n', encoding="utf-8")
    result = run_cli("tune", "--model", "no-such-model", "--out", str(tmp_path / "out"), "--prompts", str(prompts))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{prompts}, line 2: expected 'prompt'" in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_non_empty_out_without_resume_exits_2(tmp_path, tiny_verifier):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tune.log").write_text("an earlier run\n")
    result = run_cli("tune", "--model", str(tiny_verifier), "--out", str(tmp_path / "out"), "--quant", "none")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pass --resume" in lines[0]


def test_tune_distils_on_the_verifiers_cached_soft_targets(tuned):
    parts = sorted((tuned / "teacher").glob("part-*.safetensors"))
    assert parts  # the verifier's top-k per training position, cached for --resume
    info = json.loads((tuned / "ssm-1" / "spectui-tune.json").read_text())
    assert info["soft_weight"] == TuneConfig().soft_weight > 0
    assert "teacher: the verifier's top-8" in (tuned / "tune.log").read_text()
