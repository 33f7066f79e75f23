"""What every `spectui` command shares: the model options, loading, and one-line errors with exit codes.

Exit codes: 0 done, 1 runtime failure, 2 bad usage or input, 130 stopped by Ctrl+C, 141 stdout
closed by its reader (`spectui generate ... | head -c1`: 128 + SIGPIPE, what a shell reports for
a tool that SIGPIPE ends; nothing is printed). Errors are one line on stderr, never a traceback.
The command modules (generate_commands.py, chat_commands.py, tune_command.py, tune_eval_command.py)
import from here; cli.py assembles them into one Typer app.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import typer

from .engine import DEFAULT_PRESET

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE

ModelOpt = typer.Option(DEFAULT_PRESET, "--model", "-m", help="preset, hub id (org/name), model folder or .gguf file")
SsmOpt = typer.Option(None, "--ssm", help="add a speculative model (hub id, folder, or bundled:NAME for one shipped in ssms/); repeatable")
QuantOpt = typer.Option("nf4", "--quant", help="verifier weights: nf4, fp4, int8 or none")
DeviceOpt = typer.Option("auto", "--device", help="auto, cpu or cuda")
PromptsOpt = typer.Option(  # bench, tui-bench, tune-eval; None: spectui.data.bench_questions()
    None, "--prompts", help="JSONL with 'turns' (and optional 'category'), or one prompt a line "
    "(default: the 80 Vicuna-bench questions shipped with spectui)",
)


class UsageFailure(Exception):
    """Bad usage or input: exit 2."""


def fail(message: str, code: int) -> None:
    typer.echo(f"spectui: {message}", err=True)
    raise typer.Exit(code)


def quiet_broken_pipe() -> None:
    """Stdout's reader went away: exit 141 without a word (and without a flush error at exit)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere
    raise typer.Exit(EXIT_BROKEN_PIPE)


def text_arg(value: str | None) -> str | None:
    """A text argument as UTF-8: bytes that are not UTF-8 (which Python keeps as lone surrogates) become U+FFFD."""
    if value is None:
        return None
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


def check_writable(path: Path, flag: str) -> None:
    """UsageFailure now, before any model loads, when PATH cannot be written (an existing file is kept as is)."""
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageFailure(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def friendly_errors():
    """Map the engine's errors to one line and an exit code."""
    from .engine import PromptFileError
    from .engine import AttentionBackendError, ContextError, ModelLoadError, ModelSpecError, TraceError

    try:
        yield
    except (ModelSpecError, ContextError, PromptFileError, TraceError, UsageFailure, AttentionBackendError) as exc:
        fail(str(exc), 2)
    except ModelLoadError as exc:
        fail(str(exc), 2 if exc.usage else 1)
    except BrokenPipeError:
        quiet_broken_pipe()
    except ValueError as exc:  # settings validation
        fail(str(exc), 2)
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - the user sees one line, not a traceback
        fail(f"{type(exc).__name__}: {exc}", 1)


def load(run):
    """A RunSpec -> (LoadedModels, SpeculativeEngine), from spectui's model cache, with its cost cache."""
    from . import paths
    from .engine import load_engine

    return load_engine(run, cost_cache=paths.costs_dir(), models_dir=paths.models_dir())
