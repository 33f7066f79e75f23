"""ModelPickerScreen (ctrl+o): choose another model and its speculators without leaving the app.

It lists what `spectui models` lists (every preset, cached or not, then each cached model no preset
covers: engine.model_choices), a field for any other --model value (a hub id, a model folder, a .gguf
file), and the speculators for the model in that field (engine.speculator_choices: the preset's own
SSMs, the n-gram drafter alone, none, each shipped or cached SSM). Highlighting a model puts it in
the field and lists its speculators; enter on a model moves to its speculators, enter on a
speculator (or in the field, or Switch) returns (model, speculators). A model or SSM that names
nothing loadable gets one line under the field and the screen stays open. Like every dialog its
body scrolls and Tab brings each control into view, so it works at 80x24. The app does the switch
(model_actions.py).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from .. import paths
from ..engine import ModelSpecError, choose_speculators, model_choices, resolve_model, speculator_choices


def check_choice(model: str, speculators: str) -> None:
    """ModelSpecError with one line for the user when the model or the SSM names nothing loadable."""
    if not model:
        raise ModelSpecError("enter a model: a preset, a hub id (org/name), a model folder or a .gguf file")
    try:
        choose_speculators(resolve_model(model), speculators)
    except ModelSpecError as exc:
        raise ModelSpecError(str(exc).removeprefix("--model ").removeprefix("--ssm ")) from None


class ModelPickerScreen(ModalScreen[tuple[str, str] | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, model: str, speculators: str) -> None:
        super().__init__()
        self.model, self.speculators = model, speculators  # what the app runs now
        self.rows = model_choices(paths.models_dir())
        if model not in [row["spec"] for row in self.rows]:
            self.rows.insert(0, {"spec": model, "label": "the model of this session", "cached": True})
        self.choices: list[tuple[str, str]] = []  # the speculators listed for the model in the field

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="model-picker", can_focus=False):
            yield Label("Model and speculators  (enter chooses, tab moves, esc cancels)", classes="dialog-title")
            yield OptionList(*[Option(self.model_line(row)) for row in self.rows], id="model-list")
            with Horizontal(classes="field"):
                yield Label("Model", classes="field-label")
                yield Input(self.model, id="model-spec", compact=True, placeholder="preset, hub id (org/name), folder or .gguf")
            yield Static("", id="model-spec-error", classes="field-error")
            yield Label("Speculators (SSMs) for this model", classes="hint")
            yield OptionList(id="ssm-list")
            with Horizontal(classes="buttons"):
                yield Button("Switch", id="switch", variant="primary")
                yield Button("Cancel", id="cancel")

    def model_line(self, row: dict) -> str:
        mark = "● " if row["spec"] == self.model else "  "
        cached = "" if row["cached"] else " · not cached: choosing it downloads it"
        return f"{mark}{escape(row['spec'])}  [dim]{escape(row['label'])}{cached}[/dim]"

    def on_mount(self) -> None:
        self.query_one("#model-spec-error").display = False
        listing = self.query_one("#model-list", OptionList)
        listing.highlighted = [row["spec"] for row in self.rows].index(self.model)
        self.list_speculators(self.model)
        listing.focus()
        self.call_after_refresh(self.query_one("#model-picker").scroll_home, animate=False)  # the title too, in short windows

    def list_speculators(self, model: str) -> None:
        self.choices = speculator_choices(model, paths.models_dir())
        names = [choice for choice, _ in self.choices]
        current = self.speculators if model == self.model else None
        if current == "default" and current not in names:
            current = "ngram"  # a model without a preset: its default is the n-gram drafter
        listing = self.query_one("#ssm-list", OptionList)
        listing.clear_options()
        listing.add_options([Option(f"{'● ' if c == current else '  '}{escape(label)}") for c, label in self.choices])
        listing.highlighted = names.index(current) if current in names else 0

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id == "model-list":
            self.query_one("#model-spec", Input).value = self.rows[event.option_index]["spec"]

    def on_input_changed(self, event: Input.Changed) -> None:
        self.show_error(None)
        self.list_speculators(event.value.strip())

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_list.id == "model-list":
            self.query_one("#ssm-list").focus()
        else:
            self.switch()

    def on_input_submitted(self) -> None:
        self.switch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self.switch()

    def show_error(self, text: str | None) -> None:
        line = self.query_one("#model-spec-error", Static)
        line.display = bool(text)
        line.update(f"✗ {text}" if text else "")

    def switch(self) -> None:
        model = self.query_one("#model-spec", Input).value.strip()
        highlighted = self.query_one("#ssm-list", OptionList).highlighted
        speculators = self.choices[highlighted][0] if self.choices and highlighted is not None else "default"
        try:
            check_choice(model, speculators)
        except ModelSpecError as exc:
            self.show_error(str(exc))
            self.query_one("#model-spec").focus()
            return
        self.dismiss((model, speculators))
