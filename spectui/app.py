"""SpecTuiApp: what the chat and the replay share. Each mode is its own controller, a subclass.

`ChatApp` (chat_app.py) is `spectui chat`: the engine process, the turns, the history.
`ReplayApp` (replay_app.py) is `spectui replay`: a recorded trace played through the same screen,
no model loaded. Textual looks a key's action and a message's handler up on the app class, so
each controller holds the keys and messages of its own mode, and a key one mode has no use for
finds no action in it. This class holds what both do alike: the config and the themes, the view
toggles (step mode, token origins), help, copying a message, a code block or the last answer
(message_actions.py) and the command palette (PALETTE: a mode lists the entries it has an action
for). A mode says how it opens (`open`), what f6 does (`action_next_step`) and whether a setting
chosen in the app is saved for the next start (`keep`: the chat saves it, a replay keeps it for
its session).

Textual calls a message handler (`on_*`) of every class in the MRO, so a handler defined here
is never defined again in a subclass; the subclasses override plain methods.
"""

from __future__ import annotations

from typing import Iterable

from textual.app import App, SystemCommand
from textual.screen import Screen

from . import paths
from .config import Config, load_config
from .message_actions import CopyActions
from .screens.chat import ChatScreen
from .screens.dialogs import HelpScreen
from .themes import STYLESHEET, THEMES
from .widgets.prompt import recognise_escape_enter


# the command palette: (title, what it does, the action it runs); a mode lists those it has an action for
PALETTE: tuple[tuple[str, str, str], ...] = (
    ("Help: key bindings", "List every key", "help"),
    ("Step mode", "Pause after every verifier step (toggle)", "toggle_step_mode"),
    ("Next step", "Advance one verifier step (step mode, replay)", "next_step"),
    ("Token origins", "Colour tokens by SSM 1 / SSM 2 / n-gram / bonus (toggle)", "toggle_origins"),
    ("Side panel", "Show or hide the token tree and acceptance (ctrl+t)", "toggle_panel"),
    ("New conversation", "Start a new chat", "new_conversation"),
    ("Conversations", "List, switch, rename, delete chats", "conversations"),
    ("Settings", "System prompt, temperature, top-p, tree, SSMs, max tokens", "settings"),
    ("Model", "Switch the model and its SSMs; the conversation stays (ctrl+o)", "pick_model"),
    ("Search earlier prompts", "Find a prompt you sent and edit or send it again (ctrl+r)", "search_prompts"),
    ("Copy last answer", "Copy the last answer to the clipboard", "copy_answer"),
    ("Export to Markdown", "Write this conversation to a Markdown file", "export"),
    ("Stop", "Stop generating (a replay: pause it)", "stop"),
)


class SpecTuiApp(CopyActions, App):
    TITLE = "spectui"
    CSS_PATH = STYLESHEET

    def __init__(self, overrides: dict | None = None, step_mode: bool | None = None) -> None:
        super().__init__()
        self.config: Config = load_config(paths.config_file())  # this session's; the file changes only in keep()
        for name, value in (overrides or {}).items():  # command-line flags: this session only
            setattr(self.config, name, value)
        if step_mode is not None:
            self.config.step_mode = step_mode
        recognise_escape_enter()  # alt+enter as tmux sends it: a new line, not a send

    @property
    def chat(self) -> ChatScreen:
        return self.screen_stack[0]

    # ---- start-up
    def on_mount(self) -> None:
        for theme in THEMES:
            self.register_theme(theme)
        self.theme = self.config.theme if self.config.theme in self.available_themes else "spectui-dark"
        self.config.theme = self.theme  # an unknown theme stays in the file; the signal below only saves a new choice
        self.theme_changed_signal.subscribe(self, self.on_theme_changed)

    async def on_ready(self) -> None:
        self.chat.set_colour_origins(self.config.colour_origins)
        if self.config.notice:
            self.notify(self.config.notice, severity="warning", timeout=10)
        await self.open()

    async def open(self) -> None:
        """The mode's start: step mode, the status line, and what it shows first."""
        raise NotImplementedError

    # ---- view toggles, help, themes
    def action_toggle_step_mode(self) -> None:
        self.remember(step_mode=not self.config.step_mode)
        self.chat.set_step_mode(self.config.step_mode)
        self.notify(f"step mode {'on: f6 advances one verifier step' if self.config.step_mode else 'off'}")

    def action_toggle_origins(self) -> None:
        self.remember(colour_origins=not self.config.colour_origins)
        self.chat.set_colour_origins(self.config.colour_origins)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def on_theme_changed(self, theme) -> None:
        if theme.name == self.config.theme:  # also signalled for the theme set at start
            return
        self.remember(theme=theme.name)
        self.chat.set_colour_origins(self.config.colour_origins)  # the legend's and the tokens' colours

    def remember(self, **changes) -> bool:
        """Settings the user chose in the app: this session's, and those the mode keeps (`keep`)."""
        for name, value in changes.items():
            setattr(self.config, name, value)
        return self.keep(changes) if changes else True

    def keep(self, changes: dict) -> bool:
        """Save these settings for the next start; False (said why) when they could not be.
        Here: nothing is saved (a replay changes only its own session); the chat saves them."""
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): Textual's own, then PALETTE's entries whose action this mode has."""
        yield from super().get_system_commands(screen)
        for title, text, action in PALETTE:
            if hasattr(self, f"action_{action}"):
                yield SystemCommand(title, text, getattr(self, f"action_{action}"))

    def action_toggle_panel(self) -> None:
        """ctrl+t on the chat screen, from the palette too."""
        self.chat.action_toggle_panel()

    def action_next_step(self) -> None:
        """f6: the next verifier step (the chat's engine, or the replay's next recorded step)."""
        raise NotImplementedError
