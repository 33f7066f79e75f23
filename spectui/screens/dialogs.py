"""Dialogs: help (key bindings), conversation list, rename, confirm. Settings: settings.py.

Every dialog fits any window: its body scrolls (arrow keys, page keys, the mouse) and keyboard
focus scrolls the focused control into view, so at 80x24 every control is reachable.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown, OptionList, Static
from textual.widgets.option_list import Option

KEYS = [  # docs/tui.md lists the same keys
    ("enter", "send the message"),
    ("/file PATH", "put a text file in the message: a line /file PATH is replaced by the file's text when the message is sent (a question can go on the lines around it)"),
    ("ctrl+j or alt+enter", "new line in the message (both work under tmux; shift+enter and ctrl+enter where the terminal reports them)"),
    ("escape", "stop generating (within one verifier step); the partial answer is kept. Else: cancel an edit, or leave a selected message"),
    ("f1", "this help"),
    ("f2", "conversations: open (enter), new (n), rename (r), delete (d, asks first)"),
    ("f3", "settings: system prompt, temperature, top-p, tree, SSMs, max new tokens, merge"),
    ("f4", "colour tokens by origin (SSM 1, SSM 2, n-gram, verifier bonus)"),
    ("f5", "step mode: pause after every verifier step and explain it: a legend of q and p, each drafted token accepted ✓, rejected ✗ or not reached ○, and under sampling the test's numbers (docs/teaching.md)"),
    ("f6", "next step (step mode, replay)"),
    ("f7 / f8", "browse earlier / later steps of the answer (or [ ] and ← → in the tree); the explanation follows the step shown"),
    ("tab, then ↑ ↓ page up / down", "step mode's explanation under the tree: tab (or a click) reaches it, the arrow and page keys scroll it where a small window cuts it"),
    ("f9", "copy the last answer to the clipboard"),
    ("ctrl+t", "show / hide the side panel (token tree, acceptance); below 100 columns it is hidden unless step mode is on"),
    ("alt+↑ / alt+↓", "select the message above / below (from the message box: the last one); below the last, back to the message box"),
    ("c", "selected message: copy it to the clipboard"),
    ("b", "selected answer: copy its code blocks, one per press, in turn"),
    ("e", "selected message of yours: edit it in the message box; enter sends it in a copy of the chat, from that message on (this chat stays as it was)"),
    ("r", "selected last answer: regenerate it in a copy of the chat (this chat keeps the earlier answer)"),
    ("n", "selected last answer: continue it (one cut at the token limit); the saved answer grows in place"),
    ("ctrl+n", "new conversation"),
    ("↑ / ↓", "in an empty message box: the prompts sent before (any conversation), newest first; edit one or send it again"),
    ("ctrl+r", "search the prompts sent before; enter puts the chosen one in the message box"),
    ("ctrl+o", "switch the model and its SSMs (the presets and cached models `spectui models` lists, or a folder or hub id); the conversation stays and its next turns go to the new model, which the next start loads too"),
    ("ctrl+e", "restart the engine after its process stopped"),
    ("ctrl+p", "command palette (themes, export, everything above)"),
    ("ctrl+q", "quit"),
    ("space / n / + / -", "replay: play-pause / step / faster / slower"),
]
NOTES = (
    "While an answer streams, ctrl+n and opening or deleting its conversation stop it first; "
    "what it streamed is saved. The mouse works too: click, scroll, buttons. "
    "↑ ↓ and page keys scroll this help."
)


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        rows = "\n".join(f"| `{key}` | {what} |" for key, what in KEYS)
        with VerticalScroll(classes="dialog", id="help"):
            yield Markdown("## spectui keys\n\n| key | does |\n|---|---|\n" + rows + "\n\n" + NOTES)
            yield Button("Close", id="close")

    def on_mount(self) -> None:
        self.query_one("#help").focus()  # the arrow and page keys scroll

    def on_button_pressed(self) -> None:
        self.dismiss()


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; y or the action button confirms, n, escape or Keep (focused first) declines."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, action: str) -> None:
        super().__init__()
        self.question, self.action = question, action

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="confirm", can_focus=False):
            yield Static(self.question, id="question")
            yield Label(f"y {self.action.lower()} · n or esc keep it", classes="hint")
            with Horizontal(classes="buttons"):
                yield Button(self.action, id="yes", variant="error")
                yield Button("Keep", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


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


def when(stamp: float, now: float | None = None) -> str:
    """A conversation's last activity for its line in the list: today 14:02, yesterday 09:15,
    3 Nov 18:40, or 3 Nov 2025 in another year (local time)."""
    import datetime as dt

    moment = dt.datetime.fromtimestamp(stamp)
    today = dt.datetime.fromtimestamp(now if now is not None else dt.datetime.now().timestamp()).date()
    if moment.date() == today:
        return f"today {moment:%H:%M}"
    if moment.date() == today - dt.timedelta(days=1):
        return f"yesterday {moment:%H:%M}"
    if moment.year == today.year:
        return f"{moment.day} {moment:%b %H:%M}"
    return f"{moment.day} {moment:%b %Y}"


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
        with VerticalScroll(classes="dialog", id="conversations", can_focus=False):
            yield Label("Conversations — enter open · n new · r rename · d delete · esc close")
            options = [Option(f"{'● ' if r.id == self.current else '  '}{escape(r.title)}  [dim]{when(r.updated)}[/dim]", id=str(r.id))
                       for r in self.records]
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
