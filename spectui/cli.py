"""The `spectui` command line: one Typer app assembled from the command modules.

    generate, models, bench      generate_commands.py (the engine without the app)
    chat, replay, tui-bench      chat_commands.py (the Textual app)
    tune, tune-eval              tune_command.py, tune_eval_command.py (engine/tune/)

What the commands share (model options, loading, one-line errors and exit codes: 0 done,
1 runtime failure, 2 bad usage or input, 130 interrupted, 141 stdout closed) is in options.py;
this module only assembles, in the order `spectui --help` lists them.
"""

from __future__ import annotations

import sys

import typer

from . import __version__
from .chat_commands import chat, replay, tui_bench
from .generate_commands import bench, generate, models
from .tune_command import tune
from .tune_eval_command import tune_eval

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's too
    help="Terminal chat on SpecInfer-style tree speculation.",
)


def print_version(value: bool) -> None:
    if value:
        typer.echo(f"spectui {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True, help="print the version and exit"),
) -> None:
    """Terminal chat on SpecInfer-style tree speculation."""


for name, command in (("generate", generate), ("models", models), ("bench", bench), ("chat", chat),
                      ("replay", replay), ("tui-bench", tui_bench), ("tune", tune), ("tune-eval", tune_eval)):
    app.command(name)(command)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("spectui: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # python -m spectui.cli
    main()
