"""Dialogs: help (key bindings), conversation list, rename, and generation settings."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown, OptionList, Switch
from textual.widgets.option_list import Option

from ..config import Config

KEYS = [
    ("enter", "send the message"),
    ("ctrl+j (shift+enter, alt+enter)", "new line in the message"),
    ("escape", "stop generating (within one verifier step); the partial answer is kept"),
    ("f1", "this help"),
    ("f2", "conversations: open, new (n), rename (r), delete (d)"),
    ("f3", "settings: system prompt, temperature, top-p, tree, SSMs, max new tokens"),
    ("f4", "colour tokens by origin (SSM 1, SSM 2, n-gram, verifier bonus)"),
    ("f5", "step mode: pause after every verifier step"),
    ("f6", "next step (step mode, replay)"),
    ("f7 / f8", "browse earlier / later steps of the answer (or [ ] in the tree)"),
    ("f9", "copy the last answer to the clipboard"),
    ("ctrl+n", "new conversation"),
    ("ctrl+r", "restart the engine after its process stopped"),
    ("ctrl+p", "command palette (themes, export, everything above)"),
    ("ctrl+q", "quit"),
    ("space / n / + / -", "replay: play-pause / step / faster / slower"),
]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        rows = "\n".join(f"| `{key}` | {what} |" for key, what in KEYS)
        with Vertical(classes="dialog", id="help"):
            yield Markdown("## spectui keys\n\n| key | does |\n|---|---|\n" + rows + "\n\nThe mouse works too: click, scroll, buttons.")
            yield Button("Close", id="close")

    def on_button_pressed(self) -> None:
        self.dismiss()


class TextPromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, prompt: str, value: str = "") -> None:
        super().__init__()
        self.prompt, self.value = prompt, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.prompt)
            yield Input(self.value, id="text")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConversationsScreen(ModalScreen[tuple[str, int | None] | None]):
    """Returns ('open', id), ('new', None), ('rename', id) or ('delete', id)."""

    BINDINGS = [
        Binding("escape,f2", "dismiss(None)", "Close"),
        Binding("n", "choose('new')", "New"),
        Binding("r", "choose('rename')", "Rename"),
        Binding("d", "choose('delete')", "Delete"),
    ]

    def __init__(self, records, current: int | None) -> None:
        super().__init__()
        self.records, self.current = records, current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="conversations"):
            yield Label("Conversations — enter open · n new · r rename · d delete · esc close")
            options = [Option(("● " if r.id == self.current else "  ") + r.title, id=str(r.id)) for r in self.records]
            yield OptionList(*options, id="conversation-list")
            with Horizontal(classes="buttons"):
                yield Button("New", id="new")
                yield Button("Rename", id="rename")
                yield Button("Delete", id="delete", variant="error")

    def on_mount(self) -> None:
        listing = self.query_one(OptionList)
        ids = [r.id for r in self.records]
        if self.current in ids:
            listing.highlighted = ids.index(self.current)

    def highlighted_id(self) -> int | None:
        listing = self.query_one(OptionList)
        if listing.highlighted is None:
            return None
        return int(listing.get_option_at_index(listing.highlighted).id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(("open", int(event.option.id)))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose(event.button.id)

    def action_choose(self, what: str) -> None:
        target = None if what == "new" else self.highlighted_id()
        if what != "new" and target is None:
            return
        self.dismiss((what, target))


class SettingsScreen(ModalScreen[tuple[Config, str | None] | None]):
    """Edit generation settings (saved to the config) and this conversation's system prompt."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, config: Config, system: str | None) -> None:
        super().__init__()
        self.config, self.system = config, system

    def compose(self) -> ComposeResult:
        c = self.config
        with Vertical(classes="dialog", id="settings"):
            yield Label("Settings")
            with Grid(id="settings-grid"):
                yield Label("System prompt (this conversation)")
                yield Input(self.system or "", id="system", compact=True)
                yield Label("Temperature (0 = greedy)")
                yield Input(str(c.temperature), id="temperature", compact=True)
                yield Label("Top-p")
                yield Input(str(c.top_p), id="top_p", compact=True)
                yield Label("Tree: auto, or children per depth (e.g. 1,1,1)")
                yield Input(c.tree, id="tree", compact=True)
                yield Label("Max new tokens")
                yield Input(str(c.max_new_tokens), id="max_new_tokens", compact=True)
                yield Label("Speculate (SSMs on)")
                yield Switch(c.speculate, id="speculate")
                yield Label("Merge the SSMs' trees (union or vote)")
                yield Input(c.merge, id="merge", compact=True)
            yield Label("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        self.save()

    def on_input_submitted(self) -> None:
        self.save()

    def save(self) -> None:
        value = lambda name: self.query_one(f"#{name}", Input).value.strip()  # noqa: E731
        try:
            config = Config(**{**self.config.__dict__, "notice": None})
            config.temperature = float(value("temperature"))
            config.top_p = float(value("top_p"))
            config.tree = value("tree")
            config.max_new_tokens = int(value("max_new_tokens"))
            config.speculate = self.query_one("#speculate", Switch).value
            config.merge = value("merge")
            config.settings()
        except ValueError as exc:
            self.query_one("#settings-error", Label).update(f"✗ {exc}")
            return
        self.dismiss((config, value("system") or None))
