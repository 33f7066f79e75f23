"""`spectui generate`, `spectui models` and `spectui bench`: the engine without the app.

Every flag and output path is checked before any model loads. Ctrl+C stops generation within
one verifier step; what was generated stays on stdout (and in the trace).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from . import paths
from .data import bench_questions
from .documents import DocumentError, read_document, read_stream
from .engine import (
    DEFAULT_MERGE, CacheEntryError, Conversation, GenerationSettings, RunInfo, RunSpec, cache_entries, chat_turn, parse_tree,
    preset_rows, remove_cache_entry, tree_text, write_trace,
)
from .options import (
    DeviceOpt, ModelOpt, PromptsOpt, QuantOpt, SsmOpt, UsageFailure, check_writable, friendly_errors, load,
    quiet_broken_pipe, text_arg,
)


def make_settings(max_new_tokens, temperature, top_p, seed, tree, no_spec, merge=DEFAULT_MERGE):
    return GenerationSettings(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        tree_shape=parse_tree(tree),
        speculate=not no_spec,
        merge=merge,
    )


def generate(
    prompt: Optional[str] = typer.Argument(None, help="the user message; - reads it from stdin"),
    file: Optional[Path] = typer.Option(None, "--file", help="read the user message from this text file (UTF-8)"),
    model: str = ModelOpt,
    ssm: Optional[list[str]] = SsmOpt,
    quant: str = QuantOpt,
    device: str = DeviceOpt,
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="sampling seed: the same text again with a fixed --tree or --no-spec (the auto tree's "
        "shape follows measured costs, and sampling draws along the tree)"
    ),
    tree: str = typer.Option(tree_text(), "--tree", help="auto (chosen each step by measured cost) or children per node at each depth, e.g. 1,1,1"),
    no_spec: bool = typer.Option(False, "--no-spec", help="incremental decoding, one token per verifier step"),
    merge: str = typer.Option(
        DEFAULT_MERGE, "--merge", help="merge the speculators' trees: union (all) or vote (per depth, the most agreed)"
    ),
    system: Optional[str] = typer.Option(None, "--system", help="system prompt"),
    as_json: bool = typer.Option(False, "--json", help="print StepEvents as JSON lines instead of text"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="record StepEvents to this JSONL file"),
) -> None:
    """Stream the answer to PROMPT (or stdin with -, or --file PATH) on stdout; a one-line summary goes to stderr."""
    from .engine import check_quant

    with friendly_errors():
        prompt, system = read_prompt(prompt, file), text_arg(system)
        run = RunSpec(model, tuple(ssm or ()), quant=quant, device=device,
                      settings=make_settings(max_new_tokens, temperature, top_p, seed, tree, no_spec, merge))
        settings = run.settings
        check_quant(quant)  # with the other flags, before the model is looked up
        settings.detail = as_json or trace is not None  # trees with text and probabilities only when recorded
        if trace is not None:
            check_writable(trace, "--trace")
        models, engine = load(run)
        conversation = Conversation(system=system)
        conversation.add("user", prompt)
        events = chat_turn(engine, models, conversation, settings)
        info = RunInfo(
            model=models.preset.name,
            ssms=engine.speculator_names if settings.speculate else [],
            device=models.device,
            quant=models.quant,
            attention_backend=models.attention_backend,
            prompt=prompt,
            system=system,
            temperature=settings.temperature,
            top_p=settings.top_p,
            tree_shape=settings.tree_shape if settings.auto else list(settings.tree_shape),
            max_new_tokens=settings.max_new_tokens,
            merge=settings.merge,
        )
        with contextlib.ExitStack() as stack:
            if trace is not None:
                handle = stack.enter_context(open(trace, "w", encoding="utf-8"))
                events = write_trace(handle, info, events)
            last = stream(events, as_json)
        if last is not None:
            typer.echo(summary_line(last, models), err=True)
            if last.stop_reason == "stopped":
                raise typer.Exit(130)


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The user message: the argument, stdin for -, or --file's text. UsageFailure (exit 2) before any model loads."""
    if prompt is not None and file is not None:
        raise UsageFailure("give the prompt as an argument or with --file, not both")
    if file is not None:
        where = f"--file {file}"
        try:
            text = stdin_text() if str(file) == "-" else read_document(file)
        except DocumentError as exc:
            raise UsageFailure(f"--file: {exc}") from None
    elif prompt == "-":
        where, text = "stdin", stdin_text()
    elif prompt is None:
        raise UsageFailure("no prompt: give it as an argument, - to read stdin, or --file PATH")
    else:
        where, text = "", text_arg(prompt)
    if not text.strip():
        raise UsageFailure(f"the prompt is empty{f' ({where})' if where else ''}")
    return text


def stdin_text() -> str:
    if sys.stdin.isatty():
        typer.echo("spectui: reading the prompt from stdin (ctrl+d ends it)", err=True)
    return read_stream(sys.stdin.buffer)


def stream(events, as_json: bool):
    """Print events as they come; Ctrl+C ends the stream after the step in flight, a closed stdout quietly."""
    last = None
    try:
        try:
            for event in events:
                last = event
                if event.notice:
                    typer.echo(f"spectui: {event.notice}", err=True)
                if as_json:
                    sys.stdout.write(event.to_json() + "\n")
                else:
                    sys.stdout.write(event.new_text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            if last is not None:
                last.stop_reason = "stopped"
        if not as_json:
            sys.stdout.write("\n")
            sys.stdout.flush()
    except BrokenPipeError:
        quiet_broken_pipe()  # the generation stops here; the trace keeps the steps so far
    return last


def summary_line(event, models) -> str:
    reason = f", stopped ({event.stop_reason})" if event.stop_reason in ("stopped", "length") else ""
    speedup = f"speed-up {event.speedup:.2f}x" if event.speedup is not None else "speed-up n/a"
    return (
        f"{event.total_tokens} tokens in {event.elapsed_s:.1f} s: {event.tokens_per_s:.1f} tokens/s, "
        f"{event.mean_accepted:.2f} tokens per verifier step, acceptance {event.acceptance_rate:.0%}, {speedup}, "
        f"attention {event.attention_backend}, {models.quant} on {models.device}{reason}"
    )


def models(
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    remove: Optional[str] = typer.Option(None, "--remove", metavar="NAME",
                                         help="delete this model from the model cache (a name the list shows, or a preset)"),
) -> None:
    """List the model presets (verifier, SSMs, source, cached or not) and what the model cache holds."""
    with friendly_errors():
        if remove is not None:
            try:
                entry = remove_cache_entry(paths.models_dir(), remove)
            except CacheEntryError as exc:
                raise UsageFailure(str(exc)) from None
            typer.echo(f"removed {entry['name']} ({size_text(entry['bytes'])}, {entry['path']})")
            return
        rows, entries = preset_rows(paths.models_dir()), cache_entries(paths.models_dir())
        if as_json:
            cache = {"path": str(paths.models_dir()), "bytes": sum(e["bytes"] for e in entries), "entries": entries}
            typer.echo(json.dumps({"presets": rows, "cache": cache}, indent=2))
            return
        for row in rows:
            ssms = ", ".join(row["ssms"]) or "-"
            if row["extra_ssms"]:
                ssms += f"; not drafted by default: {', '.join(row['extra_ssms'])}"
            cached = "cached" if row["cached"] else "not cached"
            typer.echo(f"{row['name']:<14} verifier {row['verifier']}; SSMs {ssms}; {row['source']}; {cached}")
        total = size_text(sum(e["bytes"] for e in entries))
        typer.echo(f"\nmodel cache {paths.models_dir()}: {len(entries)} entries, {total}")
        for entry in entries:
            typer.echo(f"  {entry['name']:<40} {entry['kind']:<9} {size_text(entry['bytes']):>9}")
        if entries:
            typer.echo("remove one with: spectui models --remove NAME")


def size_text(n: int) -> str:
    """Bytes for people: 1.2 GB, 93.1 MB, 12 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def bench(
    model: str = ModelOpt,
    ssm: Optional[list[str]] = SsmOpt,
    quant: str = QuantOpt,
    device: str = DeviceOpt,
    prompts: Optional[Path] = PromptsOpt,
    limit: Optional[int] = typer.Option(None, "--limit", help="use the first N prompts"),
    per_category: Optional[int] = typer.Option(None, "--per-category", help="use the first N prompts of each category"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    json_out: Optional[str] = typer.Option(None, "--json", help="write the report as JSON to PATH, or - for stdout"),
    merge: str = typer.Option("both", "--merge", help="union: speculative rows merge by union; vote or both: add speculative-vote"),
    tree: str = typer.Option(tree_text(), "--tree", help="the speculative row's tree: auto, or children per node at each depth"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads for every method (default: all cores)"),
) -> None:
    """Every decoding method on the same prompts, greedy, order rotated per prompt: per-prompt ratios to incremental."""
    from .bench import format_table, merge_policies, read_prompts, run_bench, set_threads
    from .engine import check_quant

    with friendly_errors():
        if max_new_tokens < 1:
            raise UsageFailure("--max-new-tokens must be at least 1")
        if limit is not None and limit < 1:
            raise UsageFailure("--limit must be at least 1")
        if per_category is not None and per_category < 1:
            raise UsageFailure("--per-category must be at least 1")
        if threads is not None and threads < 1:
            raise UsageFailure("--threads must be at least 1")
        merge_policies(merge)  # ValueError with the choices: exit 2 before any model loads
        shape = parse_tree(tree)  # likewise for a bad --tree
        check_quant(quant)
        if json_out and json_out != "-":
            check_writable(Path(json_out), "--json")  # not after the whole bench
        prompts = prompts or bench_questions()
        texts = read_prompts(prompts, limit, per_category)
        typer.echo(f"bench: {len(texts)} prompts from {prompts}", err=True)
        threads = set_threads(threads)  # before loading: the engine measures its costs per thread count
        run = RunSpec(model, tuple(ssm or ()), quant=quant, device=device,
                      settings=GenerationSettings(max_new_tokens=max_new_tokens, tree_shape=shape))  # greedy
        loaded, engine = load(run)

        def progress(done, total):
            typer.echo(f"bench: {done}/{total} prompts", err=True)

        report = run_bench(loaded, engine, texts, run.settings, progress, merge=merge, threads=threads,
                           models_dir=paths.models_dir())
        typer.echo(format_table(report), err=json_out == "-")
        if json_out == "-":
            typer.echo(json.dumps(report, indent=2))
        elif json_out:
            Path(json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
