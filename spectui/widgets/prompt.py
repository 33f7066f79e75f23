"""PromptInput: the multi-line message box. Enter sends; ctrl+j, alt+enter or shift+enter adds a newline.

Prompt history, as in a shell: Up in an empty box recalls the newest prompt sent (in any
conversation), Up again an older one, Down a newer one and, past the newest, the empty box again.
A recalled prompt that is edited is an ordinary message: Up and Down move the cursor in it again.

Which of those a terminal can deliver differs: ctrl+j arrives everywhere (it is a plain line
feed); alt+enter arrives as ESC + Enter in xterm-like terminals and under tmux and screen, which
Textual's key parser reads as a plain Enter (it drops the alt of a key it has a name for), so
`recognise_escape_enter` teaches it ESC + Enter as alt+enter; shift+enter and ctrl+enter arrive
only from terminals that report modified keys (kitty, WezTerm, foot, ghostty, iTerm2 with CSI u).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "alt+enter", "shift+enter", "ctrl+enter")
ESCAPE_ENTER = "\x1b\r"  # what alt+enter sends in xterm-like terminals, tmux and screen


class TerminalKey(str, Enum):  # shaped like textual.keys.Keys, which the parser's table holds
    ALT_ENTER = "alt+enter"


def recognise_escape_enter() -> None:
    """Report ESC + Enter as alt+enter (Textual reads it as enter). Idempotent, for the process.

    Textual's parser looks a sequence up in this table before it reissues an unknown one as keys
    (which is where the alt is lost); Textual itself maps ESC + DEL (alt+backspace) there. The
    table is private: should a Textual release move it, alt+enter sends again under tmux (ctrl+j
    still adds a line) and tests/tui/test_tmux.py fails."""
    try:
        from textual._ansi_sequences import ANSI_SEQUENCES_KEYS
    except ImportError:
        return
    ANSI_SEQUENCES_KEYS.setdefault(ESCAPE_ENTER, (TerminalKey.ALT_ENTER,))


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        text: str

    sent: list[str] = []  # prompts sent, oldest first (the app fills it from the store; TextArea's `history` is its undo)
    recalled: int | None = None  # the index of the history entry the box shows, while it shows one

    def recall(self, step: int) -> bool:
        """Up (-1) / Down (+1) through the history; False when the key should move the cursor instead."""
        showing = self.recalled is not None and self.recalled < len(self.sent) and self.text == self.sent[self.recalled]
        if not showing:
            self.recalled = None
            if step > 0 or self.text or not self.sent:
                return False
            index = len(self.sent) - 1
        else:
            index = self.recalled + step
            if index < 0:
                return True  # the oldest stays
        if index >= len(self.sent):
            self.recalled = None
            self.clear()
            return True
        self.recalled = index
        self.load_text(self.sent[index])
        self.move_cursor(self.document.end)
        return True

    def show(self, text: str) -> None:
        """Put a prompt (ctrl+r's choice) in the box, cursor at its end."""
        self.recalled = None
        self.load_text(text)
        self.move_cursor(self.document.end)
        self.focus()

    async def _on_key(self, event: events.Key) -> None:
        if event.key in ("up", "down") and self.recall(-1 if event.key == "up" else 1):
            event.stop()
            event.prevent_default()
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)
