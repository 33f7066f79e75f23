"""PromptSearchScreen (ctrl+r): find an earlier prompt by what it contains and put it in the message box.

The list shows the prompts sent in every conversation, newest first, one line each; typing narrows
it to the prompts containing the typed words (each word, case-insensitive, anywhere). Enter or a
click takes the highlighted prompt; the arrow keys move through the list while typing; Escape
keeps the box as it was.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

SHOWN = 200  # matches listed at most
LINE = 100  # characters of a prompt shown on its line


def matches(prompts: list[str], query: str) -> list[str]:
    """The prompts (newest first) that contain every word of the query, case-insensitively."""
    words = query.lower().split()
    return [p for p in reversed(prompts) if all(w in p.lower() for w in words)][:SHOWN]


def one_line(prompt: str) -> str:
    line = " ".join(prompt.split())
    return line if len(line) <= LINE else line[: LINE - 1] + "…"


class PromptSearchScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("down", "move(1)", show=False, priority=True),
        Binding("up", "move(-1)", show=False, priority=True),
    ]

    def __init__(self, prompts: list[str]) -> None:
        super().__init__()
        self.prompts = prompts  # oldest first
        self.shown: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="prompt-search"):
            yield Label("Earlier prompts: type to search, enter takes one, esc closes", classes="hint")
            yield Input(placeholder="words the prompt contains", id="query")
            yield OptionList(id="found")

    def on_mount(self) -> None:
        self.fill("")
        self.query_one("#query").focus()

    def fill(self, query: str) -> None:
        self.shown = matches(self.prompts, query)
        found = self.query_one("#found", OptionList)
        found.clear_options()
        found.add_options([Option(one_line(p)) for p in self.shown] or [Option("no prompt matches", disabled=True)])
        found.highlighted = 0 if self.shown else None

    def on_input_changed(self, event: Input.Changed) -> None:
        self.fill(event.value)

    def action_move(self, step: int) -> None:
        found = self.query_one("#found", OptionList)
        if self.shown:
            found.highlighted = min(max((found.highlighted or 0) + step, 0), len(self.shown) - 1)

    def on_input_submitted(self) -> None:
        highlighted = self.query_one("#found", OptionList).highlighted
        self.dismiss(self.shown[highlighted] if self.shown and highlighted is not None else None)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.shown[event.option_index] if self.shown else None)
