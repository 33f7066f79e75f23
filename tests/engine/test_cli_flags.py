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


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "/no/such/folder"], "no such file or folder"),
        (["   ", *NO_MODEL], "prompt is empty"),
        (["--max-new-tokens", "0", *NO_MODEL], "max-new-tokens"),
        (["--tree", "2,x", *NO_MODEL], "--tree"),
        (["--tree", "0,1", *NO_MODEL], "--tree"),
        (["--quant", "q3", *NO_MODEL], "--quant 'q3': use one of"),
        (["--merge", "majority", *NO_MODEL], "--merge must be union or vote"),
    ],
)
def test_bad_generate_input_exits_2(args, needle, fresh_home):
    prompt = [] if args[0].strip() == "" else ["hi"]
    assert needle in one_line_exit_2(run_cli("generate", *prompt, *args))


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["bench", "--limit", "1"], ["tui-bench"]])
def test_an_unknown_quant_is_refused_before_the_model_is_looked_up(command, fresh_home):
    assert "--quant 'q3': use one of nf4, fp4, int8, none" in one_line_exit_2(run_cli(*command, "--quant", "q3", *NO_MODEL))


# bench's and tune's own options; tune's with --out OUT, which must not be created (OUT/tune.log used to be
# written before --quant bogus failed), some after a model that does not exist (checked before it)
BAD_OPTIONS = [
    (["bench"], ["--merge", "all"], "--merge must be union, vote or both"),
    (["bench"], ["--limit", "0"], "--limit must be at least 1"),
    (["bench"], ["--tree", "2,x"], "--tree"),
    (["bench"], ["--threads", "0"], "--threads must be at least 1"),
    (["bench"], ["--prompts", "/no/such/prompts.jsonl"], "cannot read prompts"),
    (["tune"], ["--ssms", "0"], "--ssms must be at least 1"),
    (["tune"], ["--tokens", "0"], "--tokens must be at least 1"),
    (["tune"], ["--prompts", "/nonexistent/prompts.txt"], "no such file"),
    (["tune"], ["--model", "no-such-model"], "unknown model"),
    (["tune"], ["--hidden", "30", "--heads", "4"], "multiple of the 4 heads"),
    (["tune", *NO_MODEL], ["--quant", "bogus"], "--quant 'bogus': use one of nf4, fp4, int8, none"),
    (["tune", *NO_MODEL], ["--device", "tpu"], "--device 'tpu': use auto, cpu or cuda"),
    (["tune", *NO_MODEL], ["--seed", "-1"], "--seed -1: must be an integer from 0 to 4294967295"),
    (["tune", *NO_MODEL], ["--seed", str(2**32)], "--seed 4294967296: must be"),
    (["tune", *NO_MODEL], ["--epochs", "inf"], "--epochs inf: must be a finite number"),
]


@pytest.mark.parametrize("command, args, needle", BAD_OPTIONS)
def test_bad_bench_and_tune_options_exit_2_writing_nothing(command, args, needle, tmp_path, fresh_home):
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command[0] == "tune" else []
    assert needle in one_line_exit_2(run_cli(*command, *extra, *args))
    assert not out.exists()


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


def test_version_prints_the_package_version():
    from importlib.metadata import version

    result = run_cli("--version")
    assert result.exit_code == 0 and result.exception is None, result.output
    assert result.stdout == f"spectui {version('spectui')}\n"


@pytest.mark.parametrize("command", [[], ["generate"], ["chat"], ["models"]])
def test_h_is_help(command):
    short, long = run_cli(*command, "-h"), run_cli(*command, "--help")
    assert short.exit_code == long.exit_code == 0, short.output
    assert short.stdout == long.stdout and "Usage:" in short.stdout and "-h, --help" in short.stdout


@pytest.fixture
def documents(tmp_path):
    (tmp_path / "empty.txt").write_text(" \n\n", encoding="utf-8")
    (tmp_path / "doc.txt").write_bytes(b"The report \xff says 42.\n")
    (tmp_path / "a-folder").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "args, stdin, needle",
    [
        (["--file", "{dir}/missing.txt"], None, "spectui: --file: no such file: {dir}/missing.txt"),
        (["--file", "{dir}/a-folder"], None, "spectui: --file: {dir}/a-folder is a folder, not a text file"),
        (["--file", "{dir}/empty.txt"], None, "spectui: the prompt is empty (--file {dir}/empty.txt)"),
        (["hi", "--file", "{dir}/doc.txt"], None, "spectui: give the prompt as an argument or with --file, not both"),
        (["-", "--file", "{dir}/doc.txt"], b"hi", "spectui: give the prompt as an argument or with --file, not both"),
        ([], None, "spectui: no prompt: give it as an argument, - to read stdin, or --file PATH"),
        (["-"], b" \n\t\n", "spectui: the prompt is empty (stdin)"),
        (["-"], b"", "spectui: the prompt is empty (stdin)"),
    ],
    ids=["missing", "folder", "empty-file", "both", "both-stdin", "none", "blank-stdin", "empty-stdin"],
)
def test_bad_document_input_exits_2_before_loading(documents, args, stdin, needle):
    args = [arg.format(dir=documents) for arg in args]
    result = CliRunner().invoke(app, ["generate", *args, *NO_MODEL], input=stdin)
    assert one_line_exit_2(result) == needle.format(dir=documents)


@pytest.mark.parametrize("args, stdin", [(["--file", "{dir}/doc.txt"], None), (["-"], b"The report \xff says 42.\n")],
                         ids=["file", "stdin"])
def test_good_document_input_gets_as_far_as_the_model(documents, args, stdin):
    args = [arg.format(dir=documents) for arg in args]
    result = CliRunner().invoke(app, ["generate", *args, *NO_MODEL], input=stdin)
    assert "unknown model" in one_line_exit_2(result)


def test_oversized_document_exits_2(documents):
    from spectui.documents import MAX_BYTES

    big = documents / "big.txt"
    big.write_bytes(b"a" * (MAX_BYTES + 1))
    line = one_line_exit_2(run_cli("generate", "--file", str(big), *NO_MODEL))
    assert line == f"spectui: --file: {big} is larger than 1 MiB, more than any model's context"
    (documents / "fits.txt").write_bytes(b"a" * MAX_BYTES)  # the limit itself is allowed
    assert "unknown model" in one_line_exit_2(run_cli("generate", "--file", str(documents / "fits.txt"), *NO_MODEL))
