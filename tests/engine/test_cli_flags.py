"""Bad flags and output paths through the real CLI in process (Typer's CliRunner): one line, exit 2,
before any model is looked at.

Every case names `--model no-such-model`: a flag or output path that is checked before the model
must be the error reported, so these tests also prove nothing is loaded first (the model would
otherwise fail with its own message, or load and fail only after the whole run).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from spectui.cli import app

NO_MODEL = ["--model", "no-such-model"]
TOO_BIG = str(2**63)  # one past the largest seed torch takes as a signed 64-bit integer


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECTUI_HOME", str(home))
    return home


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_exit_2(result) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--temperature", "nan"], "--temperature"),
        (["--temperature", "inf"], "--temperature"),
        (["--temperature", "-0.5"], "--temperature"),
        (["--top-p", "nan"], "--top-p"),
        (["--top-p", "inf"], "--top-p"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.01"], "--top-p"),
        (["--seed", TOO_BIG], "--seed"),
        (["--seed", "-1"], "--seed"),
        (["--tree", "16,16,16,16,16,16,16,16"], "limit of 256"),
    ],
)
@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"]])
def test_bad_generation_flags_exit_2(command, flags, needle, fresh_home):
    result = run_cli(*command, *NO_MODEL, *flags)
    assert needle in one_line_exit_2(result)
    assert not (fresh_home / "config").exists()  # refused before the app could save it to the config


def test_good_flag_values_pass_the_checks():
    """The edges that are allowed get as far as the model (and fail there, on its name)."""
    args = ["--temperature", "0", "--top-p", "1", "--seed", str(2**63 - 1), "--tree", "2,2,1,1"]
    assert "unknown model" in one_line_exit_2(run_cli("generate", "hi", *NO_MODEL, *args))
    assert "unknown model" in one_line_exit_2(run_cli("generate", "hi", *NO_MODEL, "--seed", "0", "--temperature", "1e3"))


@pytest.mark.parametrize("where", ["missing-folder/out", "a-folder"])
def test_unwritable_trace_exits_2_before_loading(tmp_path, where):
    (tmp_path / "a-folder").mkdir()
    target = tmp_path / where
    line = one_line_exit_2(run_cli("generate", "hi", *NO_MODEL, "--trace", str(target)))
    assert line.startswith(f"spectui: cannot write --trace {target}")
    assert not (tmp_path / "missing-folder").exists()


def test_writable_trace_check_leaves_no_file(tmp_path):
    """The check creates nothing: the model's error comes next, and no empty trace stays behind."""
    trace = tmp_path / "t.jsonl"
    assert "unknown model" in one_line_exit_2(run_cli("generate", "hi", *NO_MODEL, "--trace", str(trace)))
    assert not trace.exists()


def test_unwritable_bench_json_exits_2_before_loading(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\n", encoding="utf-8")
    target = tmp_path / "missing-folder" / "report.json"
    result = run_cli("bench", *NO_MODEL, "--prompts", str(prompts), "--json", str(target))
    assert one_line_exit_2(result).startswith(f"spectui: cannot write --json {target}")
