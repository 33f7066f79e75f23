"""ChatApp: `spectui chat`, the controller of a chat with the embedded speculation engine.

The models and the engine live in a child process (engine/worker.py), so drawing never competes
with generation for the GIL; EngineLink (engine_link.py) owns that process: starting it
(LoadingScreen shows its progress), each turn (a thread worker posting one StepArrived per
verifier step and a TurnFinished at the end), and its death. Esc stops the turn within one
verifier step; in step mode the engine waits for f6 after each step. When the engine process
dies, mid-answer or idle, what was streamed is saved, one notice says what happened and ctrl+e
(or ctrl+p → Restart engine) starts a new one. History lives in SQLite (store.py): the user
message is saved when sent, the (possibly partial) answer with its token origins when the turn
ends; conversation commands are in history_actions.py, a focused message's (edit & resend,
regenerate, continue) in message_actions.py, switching the model (ctrl+o) in model_actions.py.
What the chat shares with the replay (themes, view toggles, help, copying) is SpecTuiApp (app.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from textual.app import SystemCommand
from textual.screen import Screen

from . import paths
from .app import SpecTuiApp
from .config import GENERATION, ConfigError, save_config
from .documents import DocumentError, expand_file_commands
from .engine import GenerationSettings, RunSpec, prepare_engine_process
from .engine_link import EngineLink
from .history_actions import HistoryActions
from .message_actions import MessageActions
from .messages import EngineLost, LoadFailed, LoadProgress, ModelsLoaded, StepArrived, TurnFinished
from .model_actions import ModelActions
from .screens.chat import ChatScreen
from .screens.loading import LoadingScreen
from .screens.settings import SettingsScreen
from .store import ConversationRecord, Store


@dataclass
class Turn:
    """The answer being generated: where it is saved, and which speculators drafted it."""

    record_id: int
    speculators: list[str]
    extends: int | None = None  # the saved answer this turn continues (its message id)
    first_piece: int = 0  # where this turn's (piece, origin) entries start in the answer block


class ChatApp(HistoryActions, MessageActions, ModelActions, SpecTuiApp):
    def __init__(
        self,
        model: str | None = None,  # None: the config's (the model last picked with ctrl+o; smollm2-135m)
        ssms: Iterable[str] = (),
        quant: str = "nf4",
        device: str = "auto",
        overrides: dict | None = None,
        seed: int | None = None,
        system: str | None = None,
        trace: Path | None = None,
        step_mode: bool | None = None,
        autoload: bool = True,  # False: no model (tests feed StepEvents themselves)
        engine_threads: int | None = None,  # torch threads of the engine process (None: every core)
    ) -> None:
        super().__init__(overrides, step_mode)
        self.seed, self.system_override, self.trace = seed, system, trace
        self.info = None  # ModelInfo of the loaded models
        self.link = EngineLink(self, self.config.run_spec(model, tuple(ssms), quant, device, seed), trace, engine_threads)
        self.load_error: str | None = None
        self.generating = False
        self.store: Store | None = None
        self.record: ConversationRecord | None = None
        self.autoload = autoload
        prepare_engine_process()
        self.turn: Turn | None = None  # the answer being generated

    @property
    def engine(self):
        """The ready EngineWorker, or None (loading, failed, dead, or no model; or ready in the link's thread
        while its ModelsLoaded, which sets `info` and closes the loading screen, is still on its way here)."""
        return self.link.worker if self.link.state == "ready" and self.info is not None else None

    # ---- start-up
    def get_default_screen(self) -> Screen:
        return ChatScreen()

    async def open(self) -> None:
        chat = self.chat
        chat.set_step_mode(self.config.step_mode)
        self.store = Store(paths.history_db())
        if self.store.notice:
            self.notify(self.store.notice, severity="warning", timeout=15)
            chat.set_notice(self.store.notice, error=True)
        self.record = self.store.last()
        if self.record is not None:
            await self.open_conversation(self.record.id)
        self.refresh_prompt_history()
        chat.status.model = self.run_spec.model
        if not self.autoload:
            return
        self.set_interval(1.0, self.link.check)  # an engine that dies between turns is noticed
        self.start_engine()

    @property
    def run_spec(self) -> RunSpec:
        """What the engine process loads: the link's, which a model switch replaces."""
        return self.link.request.run

    def start_engine(self) -> bool:
        """Start the engine process unless one is starting or running (Retry, Restart, start-up)."""
        if not self.link.start():
            return False
        self.load_error = self.info = None  # `engine` stays None until this load's ModelsLoaded arrives
        self.chat.status.state = "loading…"
        self.push_screen(LoadingScreen(f"Loading {self.run_spec.model} ({self.run_spec.quant})"))
        return True

    def on_load_progress(self, message: LoadProgress) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.screen.progress(message.stage, message.fraction)

    def on_models_loaded(self, message: ModelsLoaded) -> None:
        self.info = message.info
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()
        status = self.chat.status
        status.model = f"{self.info.model} ({self.info.quant})"
        self.show_speculators()
        status.device = f"{self.info.device}, attention {self.info.attention_backend}"
        status.engine_pid = self.info.pid
        status.state = "ready"
        self.chat.set_notice(None)
        self.keep_model_choice()

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.reason
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()
        self.chat.status.state = "no model"
        self.chat.set_notice(f"Loading failed: {message.reason}. History stays available; ctrl+e retries, ctrl+o picks another model.", error=True)
        self.notify(message.reason, title="Loading failed", severity="error", timeout=15)

    def on_engine_lost(self, message: EngineLost) -> None:
        self.engine_gone(message.reason, "")

    def action_skip_loading(self) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()

    def action_restart_engine(self) -> None:
        if self.start_engine():
            self.chat.set_notice(None)
        elif self.link.state in ("starting", "ready"):
            self.notify("the engine is " + ("already starting" if self.link.state == "starting" else "running"))

    action_retry_loading = action_restart_engine

    def engine_gone(self, reason: str, saved: str) -> None:
        """The one notice for an engine process that went away."""
        self.chat.status.state = "engine stopped"
        self.chat.set_notice(f"{reason[0].upper()}{reason[1:]}.{saved} ctrl+e restarts the engine.", error=True)
        self.notify("ctrl+e restarts it", title="The engine process stopped", severity="error", timeout=15)

    # ---- a turn
    async def on_prompt_input_submitted(self, message) -> None:
        try:
            text = expand_file_commands(message.text)  # each line `/file PATH` becomes that file's text
        except DocumentError as exc:
            self.chat.set_notice(str(exc), error=True)  # the prompt box keeps what was typed
            return
        await self.send(text)

    async def send(self, text: str) -> None:
        settings = self.turn_settings()
        if settings is None:
            return  # the message box keeps the text
        if self.edit_target is not None:
            await self.fork_for_edit()  # an edited earlier message goes to a copy of its chat
        await self.answer(text, settings)

    def turn_settings(self) -> GenerationSettings | None:
        """The settings of a turn the engine can take now; else None, and one notice says why not."""
        if self.generating:
            self.notify("still answering — Esc stops", severity="warning")
            return None
        if self.engine is None:
            reason = {"failed": f"loading failed: {self.load_error}", "dead": "the engine process stopped (ctrl+e restarts it)",
                      "starting": "the model is still loading"}.get(self.link.state, "no model")
            self.notify(f"cannot answer yet: {reason}", severity="error")
            return None
        try:
            return replace(self.config.settings(self.seed), detail=True)  # the app shows the tree
        except ValueError as exc:
            self.notify(str(exc), severity="error")
            return None

    async def answer(self, text: str | None, settings: GenerationSettings, extends: int | None = None) -> None:
        """A turn: the answer to a new message `text`, or (None) the saved answer `extends` going on."""
        speculators = list(self.info.speculators) if settings.speculate else []
        history = await self.begin_answer(text, speculators, settings.greedy, self.info.quant, extends)
        self.link.begin_turn(self.record, history, text, settings, speculators)

    async def begin_answer(self, text: str | None, speculators: list[str], greedy: bool, quant: str,
                           extends: int | None = None) -> list:
        """Save the user's message and open the answer it gets (or reopen the answer that goes on);
        -> the conversation the engine answers."""
        if self.record is None:
            self.record = self.store.create(system=self.system_override)
        if text is not None and self.record.title == "New chat":
            self.record.title = self.sub_title = text.splitlines()[0][:48]
            self.store.rename(self.record.id, self.record.title)
        history = self.store.messages(self.record.id)
        if text is not None:
            self.store.add_message(self.record.id, "user", text)
            self.chat.query_one("#prompt").clear()
            self.refresh_prompt_history()
        await self.chat.begin_turn(text, speculators, greedy, quant, time.time())
        self.turn = Turn(self.record.id, speculators, extends, len(self.chat.answer.pieces))
        self.chat.set_notice(None)
        self.generating = True
        self.chat.status.state = "answering… (Esc stops)"
        return history

    async def on_step_arrived(self, message: StepArrived) -> None:
        self.chat.add_step(message.event)
        if self.config.step_mode:
            await self.chat.flush()

    async def on_turn_finished(self, message: TurnFinished) -> None:
        """The turn ended however it ended: save what streamed, with its token origins, then say why."""
        chat, turn = self.chat, self.turn
        pieces = list(chat.answer.pieces)[turn.first_piece:] if chat.answer is not None and turn else []
        await chat.end_turn(message.stop_reason or ("failed" if message.error else None))
        self.generating, self.turn = False, None
        if message.reply and self.store and turn:
            if "".join(piece for piece, _ in pieces) != message.reply:
                pieces = []  # the origins must describe exactly the saved text, or none is kept
            if turn.extends is not None:
                self.store.extend_message(turn.extends, message.reply, pieces)
            else:
                self.store.add_message(turn.record_id, "assistant", message.reply, pieces, turn.speculators)
        if message.engine_died:
            self.engine_gone(message.error, " What it streamed is saved." if message.reply else "")
        elif message.error:
            chat.set_notice(f"Generation failed: {message.error}. The conversation is kept.", error=True)
            self.notify(message.error, title="Generation failed", severity="error", timeout=15)
        if not message.engine_died:
            chat.status.state = "stopped" if message.stop_reason == "stopped" else "ready"
        await self.run_pending()

    def action_stop(self) -> None:
        if self.generating and self.engine is not None:
            self.link.stop()
            self.chat.status.state = "stopping…"
        elif self.cancel_edit():
            self.notify("edit cancelled: a message sent now starts no copy")
        elif self.focused_message() is not None:
            self.chat.query_one("#prompt").focus()  # from a selected message back to the message box

    def action_next_step(self) -> None:
        self.link.advance()

    def action_toggle_step_mode(self) -> None:
        super().action_toggle_step_mode()
        self.link.set_step_mode(self.config.step_mode)

    # ---- settings
    def action_settings(self) -> None:
        system = self.record.system if self.record else self.system_override
        self.push_screen(SettingsScreen(self.config, system), self.on_settings_saved)

    def on_settings_saved(self, result) -> None:
        if not result:
            return
        config, system = result  # only the values changed in the screen are saved, not the session's flags
        saved = self.remember(**{name: getattr(config, name) for name in GENERATION if getattr(config, name) != getattr(self.config, name)})
        if self.record is None:
            self.record = self.store.create(system=system)
        else:
            self.store.set_system(self.record.id, system)
            self.record.system = system
        self.show_speculators()
        if saved:
            self.notify("settings saved")

    def show_speculators(self) -> None:
        """The status line's SSMs: the loaded speculators, or off when speculation is off."""
        if self.info is not None:
            self.chat.status.ssms = (", ".join(self.info.speculators) or "-") if self.config.speculate else "off"

    def keep(self, changes: dict) -> bool:
        """The chat saves what the user chose in the app (these keys only) in the config file."""
        try:
            save_config(paths.config_file(), changes)
        except ConfigError as exc:
            self.notify(str(exc), title="Settings not saved", severity="error", timeout=15)
            return False
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if self.link.state in ("off", "failed", "dead"):
            yield SystemCommand("Restart engine", "Start the engine process again (ctrl+e)", self.action_restart_engine)

    def on_unmount(self) -> None:
        self.link.close()
        if self.store is not None:
            self.store.close()
