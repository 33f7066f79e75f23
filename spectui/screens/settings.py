"""SettingsScreen: generation settings (saved to the config) and this conversation's system prompt.

Each field is checked on its own when the user saves: a value the engine would refuse (a blank
number, top-p 0, tree "x") puts one line under that field, focuses it and keeps the screen open;
nothing typed is lost. The body scrolls and Tab brings every field and the buttons into view, so
it works at 80x24.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, Switch

from ..config import Config

# name, label, what a valid value is (the error line under the field)
FIELDS = (
    ("system", "System prompt", ""),
    ("temperature", "Temperature (0 = greedy)", "enter a number ≥ 0 (0 = greedy)"),
    ("top_p", "Top-p", "enter a number above 0, at most 1 (1 = off)"),
    ("tree", "Tree (auto or 2,2,1)", ""),  # the engine's own reason
    ("max_new_tokens", "Max new tokens", "enter a whole number ≥ 1"),
    ("speculate", "Speculate (SSMs on)", ""),
    ("merge", "Merge (union or vote)", "enter union or vote"),
)
PARSE = {"temperature": float, "top_p": float, "max_new_tokens": int, "tree": str, "merge": str}


def check_field(name: str, text: str):
    """The value of one settings field, or ValueError with one line for the user."""
    label, wanted = next((label, wanted) for n, label, wanted in FIELDS if n == name)
    label = label.split(" (")[0]
    try:
        value = PARSE[name](text.strip())
        Config(**{name: value}).settings()  # the engine's limits, for this field alone
    except ValueError as exc:
        reason = wanted or str(exc).split(": ", 1)[-1]  # "--tree 'x': expected ..." -> "expected ..."
        given = text.strip()
        raise ValueError(f"{label} “{given}”: {reason}" if given else f"{label} is empty: {reason}") from None
    return value


class SettingsScreen(ModalScreen[tuple[Config, str | None] | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, config: Config, system: str | None) -> None:
        super().__init__()
        self.config, self.system = config, system

    def compose(self) -> ComposeResult:
        values = {**{name: str(getattr(self.config, name, "")) for name, _, _ in FIELDS}, "system": self.system or ""}
        with VerticalScroll(classes="dialog", id="settings", can_focus=False):
            yield Label("Settings  (tab moves, enter saves, esc cancels)", classes="dialog-title")
            for name, label, _ in FIELDS:
                with Horizontal(classes="field"):
                    yield Label(label, classes="field-label")
                    if name == "speculate":
                        yield Switch(self.config.speculate, id=name)
                    else:
                        yield Input(values[name], id=name, compact=True, placeholder="none" if name == "system" else "")
                yield Static("", id=f"{name}-error", classes="field-error")
            yield Static("", id="settings-error", classes="field-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        for error in self.query(".field-error"):
            error.display = False

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        self.save()

    def on_input_submitted(self) -> None:
        self.save()

    def show_error(self, name: str, text: str | None) -> None:
        line = self.query_one(f"#{name}-error", Static)
        line.display = bool(text)
        line.update(f"✗ {text}" if text else "")

    def save(self) -> None:
        config = Config(**{**self.config.__dict__, "notice": None})
        config.speculate = self.query_one("#speculate", Switch).value
        wrong = []
        for name in PARSE:
            try:
                setattr(config, name, check_field(name, self.query_one(f"#{name}", Input).value))
                self.show_error(name, None)
            except ValueError as exc:
                self.show_error(name, str(exc))
                wrong.append(name)
        if not wrong:
            try:
                config.settings()  # the fields together
            except ValueError as exc:
                wrong.append("settings")
                self.show_error("settings", str(exc).splitlines()[0])
            else:
                self.show_error("settings", None)
        if wrong:
            self.query_one(f"#{wrong[0]}" if wrong[0] != "settings" else "#save").focus()
            return
        self.dismiss((config, self.query_one("#system", Input).value.strip() or None))
