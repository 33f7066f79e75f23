"""Agreement on unseen prompts (engine/tune/heldout.py) with a tiny random LLaMA verifier."""

from __future__ import annotations

import pytest
import torch

from spectui.engine.loading import load_causal_lm, load_models
from spectui.engine.presets import resolve_model
from spectui.engine.tune.heldout import agreement_by_category, answers_path, greedy_answers

PROMPTS = [("What is the capital of France?", "qa"), ("Name a prime number.", "math"),
           ("Write one word about the sea.", "writing"), ("Say hello.", "qa")]


@pytest.fixture(scope="module")
def models(tiny_dirs):
    return load_models(resolve_model(str(tiny_dirs["verifier"])), quant="none", device="cpu")


def test_answers_are_the_verifiers_greedy_continuations_and_cached(models, tmp_path):
    answered = greedy_answers(models, models.chat_template, PROMPTS, 12, tmp_path)
    assert [(e.prompt, c) for e, c in answered] == PROMPTS
    for example, _ in answered[:2]:
        alone = models.verifier.generate(torch.tensor([example.prompt_ids]), max_new_tokens=12, do_sample=False,
                                         eos_token_id=models.stop_token_ids(), pad_token_id=models.stop_token_ids()[0])
        assert example.answer_ids == alone[0, len(example.prompt_ids):].tolist()[: len(example.answer_ids)]
        assert example.mode == "greedy" and len(example.answer_ids) >= 1
    path = answers_path(tmp_path, models.preset.name, models.quant, PROMPTS, 12)
    stamp = path.stat().st_mtime_ns
    again = greedy_answers(models, models.chat_template, PROMPTS, 12, tmp_path)
    assert path.stat().st_mtime_ns == stamp  # read back, not regenerated
    assert [e.answer_ids for e, _ in again] == [e.answer_ids for e, _ in answered]
    assert answers_path(tmp_path, models.preset.name, models.quant, PROMPTS, 13) != path


def test_agreement_per_category_separates_a_perfect_drafter_from_a_random_one(models, tiny_dirs, tmp_path):
    answered = greedy_answers(models, models.chat_template, PROMPTS, 12, tmp_path)
    random_ssm = load_causal_lm(tiny_dirs["ssm68"], "cpu", "none")
    report = agreement_by_category([("itself", models.verifier), ("random", random_ssm)], answered, 3)
    assert set(report["categories"]) == {"qa", "math", "writing"}
    positions = sum(len(e.answer_ids) for e, _ in answered)
    assert report["all"]["positions"] == positions
    assert report["categories"]["qa"]["positions"] == sum(len(e.answer_ids) for e, c in answered if c == "qa")
    itself, random_row = report["all"]["ssms"]
    assert itself["top1"] >= 0.95  # the verifier predicts its own greedy answer (up to batching's rounding)
    assert random_row["top1"] < itself["top1"] and random_row["top3"] <= 1.0
    assert report["all"]["together"]["top1"] >= itself["top1"]


def test_tune_eval_command_reports_each_category(tiny_dirs, tmp_path):
    import json

    from typer.testing import CliRunner

    from spectui.cli import app

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t], "category": c}) + "\n" for t, c in PROMPTS), encoding="utf-8")
    args = ["tune-eval", "--model", str(tiny_dirs["verifier"]), "--ssm", str(tiny_dirs["ssm68"]), "--prompts", str(prompts),
            "--quant", "none", "--device", "cpu", "--max-new-tokens", "8"]
    result = CliRunner().invoke(app, [*args, "--json", "-"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["categories"]) == {"qa", "math", "writing"} and report["ssms"] == ["ssm68"]
    assert 0 <= report["all"]["ssms"][0]["top1"] <= report["all"]["ssms"][0]["top3"] <= 1
    table = CliRunner().invoke(app, args, catch_exceptions=False)  # the answers now come from the cache
    assert table.exit_code == 0 and "| all |" in table.stdout and "| math |" in table.stdout
    bad = CliRunner().invoke(app, [*args, "--max-new-tokens", "0"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
