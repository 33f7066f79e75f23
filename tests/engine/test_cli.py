"""The `spectui` command as a user runs it: a real process, the real embedded model.

SPECTUI_HOME points at the session's temp dir, where the embedded model folder is linked in
(tests/conftest.py), so nothing is fetched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from spectui.engine.events import StepEvent, read_trace

SPECTUI = [sys.executable, "-m", "spectui.cli"]


def spectui(*args, timeout=300):
    return subprocess.run([*SPECTUI, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy())


def in_process(*args):
    """The CLI in this process (Typer's CliRunner): no interpreter start, for what needs no real process."""
    from typer.testing import CliRunner

    from spectui.cli import app

    return CliRunner().invoke(app, list(args))


def one_clean_line(result):
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny_chat_model(tiny_dirs, embedded_dir, tmp_path_factory):
    """The tiny random verifier with the embedded chat template: a real model that loads in seconds."""
    folder = tmp_path_factory.mktemp("cli") / "tiny"
    shutil.copytree(tiny_dirs["verifier"], folder)
    shutil.copy(embedded_dir / "chat_template.jinja", folder / "chat_template.jinja")
    return folder


@pytest.mark.slow
def test_generate_answers_paris_with_summary(embedded_dir, tmp_path):
    trace = tmp_path / "t.jsonl"
    result = spectui("generate", "What is the capital of France?", "--max-new-tokens", "32", "--trace", str(trace))
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    summary = result.stderr.strip().splitlines()[-1]
    assert "tokens/s" in summary and "tokens per verifier step" in summary and "acceptance" in summary
    assert "attention exact" in summary and "nf4 on cpu" in summary
    info, events = read_trace(trace)
    assert info.model == "smollm2-135m" and info.ssms == ["smollm2-feature", "ngram"]
    assert "".join(e.new_text for e in events).strip() == result.stdout.strip()
    assert events[-1].finished and events[0].step == 0


@pytest.mark.slow
def test_generate_json_prints_step_events(embedded_dir):
    result = in_process("generate", "Count from 1 to 5.", "--max-new-tokens", "16", "--json", "--no-spec")
    assert result.exit_code == 0, result.stderr
    events = [StepEvent.from_json(line) for line in result.stdout.splitlines()]
    assert [e.step for e in events] == list(range(len(events)))
    assert all(len(e.new_tokens) == 1 for e in events)  # --no-spec: one token per verifier step
    assert events[-1].finished


def test_bad_input_is_one_line_and_exit_2():
    """The real process (the rest of the bad flags: test_cli_flags.py, in process, where a run costs no
    interpreter start): a model that does not exist is one line naming the ones that do."""
    result = spectui("generate", "hi", "--model", "no-such-model")
    assert result.returncode == 2, result.stderr
    assert "smollm2-135m, llama-7b" in one_clean_line(result)


@pytest.mark.slow
def test_mismatched_ssm_vocabulary_exits_2(embedded_dir, tiny_dirs):
    result = in_process("generate", "hi", "--ssm", str(tiny_dirs["foreign"]))
    assert result.exit_code == 2
    assert "vocabulary" in one_clean_line(result)


def test_models_json_lists_presets(embedded_dir):
    result = spectui("models", "--json")
    assert result.returncode == 0, result.stderr
    presets = {p["name"]: p for p in json.loads(result.stdout)["presets"]}
    assert set(presets) == {"smollm2-135m", "llama-7b"}
    assert presets["smollm2-135m"]["cached"] is True
    assert len(presets["smollm2-135m"]["ssms"]) == 2  # the shipped feature head and the n-gram drafter
    assert presets["smollm2-135m"]["ssms"][0] == "smollm2-feature (feature head, shipped with spectui)"
    assert presets["smollm2-135m"]["extra_ssms"] == ["smollm2-boost-1 (boost-tuned, shipped with spectui)"]
    assert presets["llama-7b"]["cached"] is False
    assert presets["llama-7b"]["verifier"] == "huggyllama/llama-7b"
    assert presets["llama-7b"]["ssms"][:2] == ["JackFram/llama-68m", "JackFram/llama-160m"]
    for p in presets.values():
        assert set(p) >= {"name", "verifier", "ssms", "source", "cached"}


@pytest.mark.slow
def test_ctrl_c_stops_and_keeps_output(embedded_dir):
    proc = subprocess.Popen(
        [*SPECTUI, "generate", "Write a long essay about the history of Rome.", "--max-new-tokens", "400"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
        # as from a terminal: a suite started in the background (`cmd &` without job control) has
        # SIGINT ignored, and a child inherits that, so Ctrl+C would never reach spectui
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stdout.read(20)  # wait until the answer streams
    assert first
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 10
    assert "Traceback" not in err
    assert proc.returncode == 130, err  # (the summary line says how the run ended)
    assert "stopped" in err
    assert len(first + out) > 20


@pytest.mark.slow
def test_generate_with_vote_merge_and_two_speculators(embedded_dir, tmp_path):
    """--ssm the embedded folder (unquantised: near-perfect) beside the preset's speculators, which agree
    on a repetitive answer: vote must leave one vote count per depth, where union would mix them."""
    trace = tmp_path / "vote.jsonl"
    result = in_process(
        "generate", "Repeat exactly: red green blue red green blue red green blue", "--max-new-tokens", "24",
        "--merge", "vote", "--tree", "1,1,1", "--ssm", str(embedded_dir), "--trace", str(trace),  # a fixed tree: every speculator drafts
    )
    assert result.exit_code == 0, result.stderr
    assert "red green blue" in result.stdout
    info, events = read_trace(trace)
    assert info.merge == "vote" and len(info.ssms) == 3  # the preset's feature head, the --ssm, n-gram
    nodes = [node for event in events[1:] for node in event.tree[1:]]
    assert any(len(node.sources) >= 2 for node in nodes), "speculators should agree somewhere"
    for event in events[1:]:
        counts = {}
        for node in event.tree[1:]:
            counts.setdefault(node.depth, set()).add(len(node.sources))
        assert all(len(c) == 1 for c in counts.values())


def test_unavailable_attention_backend_exits_2(monkeypatch):
    monkeypatch.setenv("SPECTUI_ATTENTION", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = in_process("generate", "hi", "--device", "cpu")
    assert result.exit_code == 2
    assert "SPECTUI_ATTENTION=triton" in one_clean_line(result)


def test_corrupt_gguf_is_a_clear_error_and_leaves_nothing(tmp_path):
    from spectui import paths

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(os.urandom(4096))
    result = in_process("generate", "hi", "--model", str(bad))
    assert result.exit_code == 1
    assert "cannot convert" in one_clean_line(result)
    leftovers = list((paths.models_dir() / "gguf").glob("*")) if (paths.models_dir() / "gguf").exists() else []
    assert leftovers == []


def test_non_utf8_prompt_is_decoded_with_replacement(tiny_chat_model, tmp_path):
    """argv bytes that are not UTF-8 (`spectui generate $'\\xff'`) become U+FFFD, not a TypeError."""
    trace = tmp_path / "t.jsonl"
    result = subprocess.run(
        [*SPECTUI, "generate", b"\xff", "--model", str(tiny_chat_model), "--quant", "none", "--device", "cpu",
         "--max-new-tokens", "3", "--no-spec", "--trace", str(trace), "--system", b"be \xfe brief"],
        capture_output=True, timeout=300, env=os.environ.copy(),
    )
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr and "Error" not in stderr
    info, events = read_trace(trace)
    assert info.prompt == "\ufffd" and info.system == "be \ufffd brief"
    assert sum(len(e.new_tokens) for e in events) == 3


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_prompt_from_a_file_or_stdin_is_what_the_model_gets(tiny_chat_model, tmp_path, source):
    """`spectui generate --file PATH` (in process) and `... | spectui generate -` (a real pipe): the
    document, decoded as UTF-8 with replacement, is the prompt (the trace records what the model was given)."""
    document = "Summarise:\nThe quarterly report \u2014 revenue rose 4 %.\n".encode() + b"bad byte \xff here\n"
    (tmp_path / "doc.txt").write_bytes(document)
    trace = tmp_path / "t.jsonl"
    args = ["--model", str(tiny_chat_model), "--quant", "none", "--device", "cpu", "--max-new-tokens", "3", "--no-spec",
            "--trace", str(trace)]
    if source == "file":
        result = in_process("generate", "--file", str(tmp_path / "doc.txt"), *args)
        code, stderr = result.exit_code, result.stderr
    else:
        result = subprocess.run([*SPECTUI, "generate", "-", *args], input=document, capture_output=True, timeout=300,
                                env=os.environ.copy())
        code, stderr = result.returncode, result.stderr.decode("utf-8", "replace")
    assert code == 0, stderr
    assert "Traceback" not in stderr and "reading the prompt" not in stderr  # the hint is for a terminal only
    info, events = read_trace(trace)
    assert info.prompt == document.decode("utf-8", "replace") and "\ufffd here" in info.prompt
    assert sum(len(e.new_tokens) for e in events) == 3


def test_closed_stdout_exits_quietly_with_141(tiny_chat_model):
    """`spectui generate ... | head -c1`, as text and as --json: the reader takes one byte and goes; no
    traceback, no error line. (The two processes run side by side: each is mostly its interpreter's start.)"""
    procs = [subprocess.Popen(
        [*SPECTUI, "generate", "hi", "--model", str(tiny_chat_model), "--quant", "none", "--device", "cpu",
         "--max-new-tokens", "200", "--no-spec", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy(),
    ) for flags in ([], ["--json"])]
    for proc in procs:
        assert proc.stdout.read(1)  # the answer streams (199 more steps to come)
        proc.stdout.close()  # as head -c1 exits
        err = proc.stderr.read().decode("utf-8", "replace")
        assert proc.wait(timeout=120) == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
        assert "tokens/s" not in err  # the summary line is not printed for an answer nobody reads


def test_a_model_folder_without_a_chat_template_generates_with_the_plain_one(tiny_dirs, tmp_path):
    """The template is resolved once (LoadedModels.chat_template): the tokenizer's, else the preset's,
    else the plain one, for generate as for chat and tune."""
    from spectui.engine.loading import load_models
    from spectui.engine.presets import PLAIN_CHAT_TEMPLATE, resolve_model

    assert not (tiny_dirs["verifier"] / "chat_template.jinja").exists()
    models = load_models(resolve_model(str(tiny_dirs["verifier"])), quant="none", device="cpu")
    assert models.chat_template == PLAIN_CHAT_TEMPLATE
    trace = tmp_path / "t.jsonl"
    result = in_process("generate", "hello there", "--model", str(tiny_dirs["verifier"]), "--quant", "none",
                        "--device", "cpu", "--max-new-tokens", "3", "--no-spec", "--trace", str(trace))
    assert result.exit_code == 0, result.output
    _, events = read_trace(trace)
    assert sum(len(e.new_tokens) for e in events) == 3
