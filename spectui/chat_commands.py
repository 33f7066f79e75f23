"""`spectui chat`, `spectui replay` and `spectui tui-bench`: the Textual app's commands.

Usage errors (unknown model, bad generation flags, malformed trace) are one line and exit 2,
before any screen opens; loading and generation failures show inside the app.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from .data import bench_questions
from .engine import GenerationSettings, RunSpec, resolve_model, resolve_ssm
from .options import DeviceOpt, ModelOpt, PromptsOpt, QuantOpt, SsmOpt, UsageFailure, friendly_errors, load, text_arg


def chat(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="preset, hub id (org/name), model folder or .gguf "
                                        "file (default: the model last picked in the app with ctrl+o, else smollm2-135m)"),
    ssm: Optional[list[str]] = SsmOpt,
    quant: str = QuantOpt,
    device: str = DeviceOpt,
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="default: the config's (256)"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 is greedy (default: the config's)"),
    top_p: Optional[float] = typer.Option(None, "--top-p"),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="sampling seed: the same text again with a fixed --tree or --no-spec (the auto tree's "
        "shape follows measured costs, and sampling draws along the tree)"
    ),
    tree: Optional[str] = typer.Option(None, "--tree", help="auto (the default: chosen each step by measured cost) or children per node at each depth, e.g. 2,2,1,1"),
    no_spec: bool = typer.Option(False, "--no-spec", help="incremental decoding, one token per verifier step"),
    merge: Optional[str] = typer.Option(None, "--merge", help="union or vote: how several speculators' trees merge"),
    system: Optional[str] = typer.Option(None, "--system", help="system prompt for new conversations"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="record every turn's StepEvents to this JSONL file"),
    step: bool = typer.Option(False, "--step", help="start in step mode (pause after every verifier step)"),
) -> None:
    """Open the chat: the answer streams beside the live token tree and acceptance."""
    from .chat_app import ChatApp

    with friendly_errors():
        system = text_arg(system)
        overrides = {
            name: value
            for name, value in (("max_new_tokens", max_new_tokens), ("temperature", temperature), ("top_p", top_p), ("tree", tree), ("merge", merge))
            if value is not None
        }
        if no_spec:
            overrides["speculate"] = False
        from .config import Config

        from .engine import check_quant

        check_quant(quant)
        Config(**overrides).settings(seed)  # the flags first, as generate does, before the screen opens (and saves them)
        if model is not None:  # else the config's, checked when it loads (the app says why it cannot, and ctrl+o picks another)
            resolve_model(model)
        for spec in ssm or []:
            resolve_ssm(spec)
        if trace is not None:
            try:
                trace.open("w", encoding="utf-8").close()
            except OSError as exc:
                raise UsageFailure(f"--trace {trace}: {exc.strerror or exc}") from None
        app_ = ChatApp(model, ssm or (), quant, device, overrides, seed, system, trace, step or None)
    app_.run()


def replay(
    trace: Path = typer.Argument(..., help="a trace recorded with --trace"),
    speed: float = typer.Option(1.0, "--speed", help="playback speed (1 = as recorded)"),
    paused: bool = typer.Option(False, "--paused", help="start paused; n steps, space plays"),
) -> None:
    """Replay a recorded trace in the chat screen, without loading a model."""
    from .replay import read_turns
    from .replay_app import ReplayApp

    with friendly_errors():
        if not (math.isfinite(speed) and speed > 0):  # NaN passes `speed <= 0`
            raise UsageFailure(f"--speed {speed}: must be a finite number > 0")
        turns = read_turns(trace)  # the whole trace checked: TraceError (exit 2) before the screen opens
        app_ = ReplayApp(turns, replay_name=trace.name, autoplay=not paused, speed=speed)
    app_.run()


def tui_bench(
    model: str = ModelOpt,
    ssm: Optional[list[str]] = SsmOpt,
    quant: str = QuantOpt,
    device: str = DeviceOpt,
    prompts: Optional[Path] = PromptsOpt,
    limit: int = typer.Option(4, "--limit", help="use the first N prompts"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens"),
    rounds: int = typer.Option(2, "--rounds", help="alternating headless/app rounds; medians are reported"),
    engine_threads: Optional[int] = typer.Option(None, "--engine-threads", help="torch threads of the app's engine process (default: every core)"),
) -> None:
    """Tokens/s with the chat app consuming the StepEvents vs headless, on the same prompts."""
    import json

    from .bench import read_prompts
    from .engine import check_quant
    from .tui_bench import compare

    with friendly_errors():
        if limit < 1 or rounds < 1 or max_new_tokens < 1 or (engine_threads is not None and engine_threads < 1):
            raise UsageFailure("--limit, --rounds, --max-new-tokens and --engine-threads must be at least 1")
        check_quant(quant)
        texts = read_prompts(prompts or bench_questions(), limit)
        run = RunSpec(model, tuple(ssm or ()), quant=quant, device=device,
                      settings=GenerationSettings(max_new_tokens=max_new_tokens))  # greedy
        models, engine = load(run)
        report = compare(models, engine, run, texts, rounds, lambda line: typer.echo(line, err=True), threads=engine_threads)
        typer.echo(json.dumps(report, indent=2))
        typer.echo(
            f"app {report['app_tokens_per_s']} tokens/s vs headless {report['headless_tokens_per_s']} tokens/s: "
            f"{report['app_over_headless']:.1%} kept",
            err=True,
        )
