"""`spectui tune --feature-head` at tiny scale: a tiny random LLaMA verifier, 3 prompts, ~250 answer tokens.

The head is trained through the real CLI, loaded the way `spectui chat --ssm` loads it, and the
engine's greedy output with it must equal incremental decoding. The features are cached and a
resumed run reuses them; training interrupted after a checkpoint and resumed ends with the very
weights of the uninterrupted run; the loss falls.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spectui.cli import app
from spectui.engine.chat import encode_chat
from spectui.engine.feature_drafter import FeatureDrafter
from spectui.engine.loading import build_engine, load_models
from spectui.engine.presets import resolve_model
from spectui.engine.settings import GenerationSettings
from spectui.engine.tune.config import TuneConfig
from spectui.engine.tune.feature_train import load_parts
from spectui.engine.tune.features import KeptRows, read_features
from spectui.engine.tune.pipeline import run_tune

from tiny_models import assert_same_weights

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]
ARGS = ["--ssms", "0", "--feature-head", "--feature-epochs", "4", "--feature-vocab", "512", "--tokens", "250",
        "--max-answer-tokens", "40", "--batch-size", "4", "--checkpoint-every", "2", "--quant", "none",
        "--device", "cpu", "--threads", "2"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, tiny_verifier) -> Path:
    root = tmp_path_factory.mktemp("tuned-feature")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    out = root / "out"
    result = CliRunner().invoke(app, ["tune", "--model", str(tiny_verifier), "--prompts", str(root / "prompts.txt"),
                                      "--out", str(out), *ARGS], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"--ssm {out / 'feature-head'}" in result.stdout
    return out


def test_the_head_is_trained_and_reported(tuned):
    folder = tuned / "feature-head"
    assert {"feature_head.json", "feature_head.safetensors", "spectui-tune.json"} <= {p.name for p in folder.iterdir()}
    assert not (tuned / ".feature-head.training").exists()  # checkpoints go once the head is finished
    info = json.loads((folder / "spectui-tune.json").read_text())
    assert info["draft_vocab"] == 512 and info["steps"] >= 2 and info["positions"] > 0
    assert len(list((tuned / "features").glob("part-*.safetensors"))) >= 1
    # the answers stage kept the verifier's rows as it decoded; every training sequence's features are those
    kept = KeptRows(tuned / "answer-rows")
    assert kept.where
    for part in load_parts(tuned / "features"):
        ids, starts = part["ids"].tolist(), part["starts"].tolist()
        for s, e in zip(starts[:-1], starts[1:]):
            path, ks, ke = kept.where[tuple(ids[s:e])]
            assert torch.equal(part["hidden"][s:e], read_features(path)["hidden"][ks:ke])
    assert not (tuned / "teacher").exists()  # no SSM to learn from the verifier's soft targets: none computed
    report = json.loads((tuned / "report.json").read_text())
    entry = next(e for e in report["ssms"] if e["name"] == "feature-head")
    assert 0 <= entry["agreement"]["all"]["top1"] <= entry["agreement"]["all"]["top3"] <= 1
    assert info["final_loss"] < info["first_loss"]  # it learned


def test_the_engine_drafts_with_the_tuned_head_and_stays_lossless(tuned, tiny_verifier):
    models = load_models(resolve_model(str(tiny_verifier)), (str(tuned / "feature-head"),), quant="none", device="cpu")
    engine = build_engine(models, ngram=False)
    assert [type(d) for d in engine.drafters] == [FeatureDrafter]
    ids = encode_chat(models.tokenizer, [{"role": "user", "content": PROMPTS[0]}], models.chat_template)
    runs = {}
    for speculate in (True, False):
        events = list(engine.generate(list(ids), GenerationSettings(max_new_tokens=24, speculate=speculate, tree_shape=(2, 2, 1))))
        runs[speculate] = [t for e in events for t in e.new_tokens]
        if speculate:
            assert sum(e.drafted for e in events) > 0
    assert runs[True] == runs[False]


def test_resume_reuses_the_features_and_continues_training_exactly(tuned, tiny_verifier, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tuned, out, ignore=shutil.ignore_patterns("feature-head", "report.json", "tune.log"))
    feature_times = {p.name: p.stat().st_mtime_ns for p in (out / "features").iterdir()}
    cfg = replace(TuneConfig(), out=out, model=str(tiny_verifier), prompts_file=tuned.parent / "prompts.txt", ssms=0,
                  feature_head=True, feature_epochs=4, feature_vocab=512, tokens=250, max_answer_tokens=40,
                  batch_size=4, magpie_batch=4, checkpoint_every=2, quant="none", device="cpu", threads=2, resume=True)

    class Interrupted(Exception):
        pass

    def interrupt(ssm: int, step: int, loss: float) -> None:
        if step == 3:  # after the checkpoint of step 2 and one more step that is lost
            raise Interrupted

    with pytest.raises(Interrupted):
        run_tune(cfg, after_step=interrupt)
    assert not (out / "feature-head").exists()
    run_tune(cfg)
    assert "feature head: resuming from the checkpoint at step 2/" in (out / "tune.log").read_text()
    assert {p.name: p.stat().st_mtime_ns for p in (out / "features").iterdir()} == feature_times  # not recomputed
    assert_same_weights(out / "feature-head" / "feature_head.safetensors", tuned / "feature-head" / "feature_head.safetensors")


def test_feature_head_options_are_checked(tmp_path):
    result = CliRunner().invoke(app, ["tune", "--ssms", "0", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--ssms must be at least 1 (0 with --feature-head)" in result.output
    assert not (tmp_path / "o").exists()


def test_feature_prompts_add_the_verifiers_features_over_unanswered_prompts(tiny_verifier, tmp_path):
    """--feature-prompts N: N prompts the answers did not use (one batch of 2 answered here) join the
    head's data as prompt-only sequences, in OUT/prompt-features; a resumed run reuses them."""
    from spectui.engine.tune.features import read_features

    more = PROMPTS + ["Name a colour.", "Count to five.", "Say hello in French.", "What is two plus two?"]
    (tmp_path / "prompts.txt").write_text("\n".join(more) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    args = ["tune", "--model", str(tiny_verifier), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(out),
            "--ssms", "0", "--feature-head", "--feature-epochs", "1", "--feature-vocab", "512", "--tokens", "20",
            "--max-answer-tokens", "20", "--batch-size", "2", "--quant", "none", "--device", "cpu", "--threads", "2",
            "--feature-prompts", "3"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    shards = sorted((out / "data").glob("shard-*.jsonl"))
    answered = {json.loads(line)["prompt"] for shard in shards for line in shard.read_text().splitlines()}
    assert len(answered) == 2  # one batch reached 20 answer tokens
    files = sorted((out / "prompt-features" / "features").glob("part-*.safetensors"))
    assert len(files) == 1
    part = read_features(files[0])
    assert len(part["starts"]) == 4  # three sequences
    assert part["answer_starts"].tolist() == part["starts"][1:].tolist()  # every position a prompt position
    texts = [tiny_tokenizer_decode(tiny_verifier, part["ids"][s:e].tolist())
             for s, e in zip(part["starts"][:-1].tolist(), part["starts"][1:].tolist())]
    chosen = [p for p in more if any(p in t for t in texts)]
    assert len(chosen) == 3 and not set(chosen) & answered
    info = json.loads((out / "feature-head" / "spectui-tune.json").read_text())
    answer_positions = sum(int(read_features(f)["starts"][-1]) for f in (out / "features").glob("part-*.safetensors"))
    assert info["positions"] == answer_positions + int(part["starts"][-1])

    shutil.rmtree(out / "feature-head")
    stamp = files[0].stat().st_mtime_ns
    assert CliRunner().invoke(app, [*args, "--resume"], catch_exceptions=False).exit_code == 0
    assert files[0].stat().st_mtime_ns == stamp  # reused, not recomputed


def tiny_tokenizer_decode(folder: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).decode(ids)
