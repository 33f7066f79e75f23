"""ReplayApp: `spectui replay`, the controller that plays a recorded trace in the chat's screen.

No model is loaded and nothing is saved. A ReplayCursor (replay.py) holds the recorded turns;
each tick posts the next recorded StepEvent as the same StepArrived message a live turn posts,
so replayed answers are drawn by the chat's own code path (`ChatScreen.add_step`), always in
step mode. space plays or pauses, n (or f6) steps, + and - change the speed, Esc pauses. The
answers can be browsed and copied (SpecTuiApp, app.py), not changed: e, r and n on a message
say so. The chat's own keys (conversations, settings, the model, the engine) have no action here.
"""

from __future__ import annotations

from typing import Iterable

from textual.app import SystemCommand
from textual.screen import Screen

from .app import SpecTuiApp
from .messages import StepArrived
from .replay import ReplayCursor
from .screens.chat import ReplayScreen
from .widgets.conversation import AnswerBlock, UserBlock


class ReplayApp(SpecTuiApp):
    def __init__(self, turns: list, replay_name: str = "", autoplay: bool = True, speed: float = 1.0) -> None:
        super().__init__()
        self.cursor = ReplayCursor(turns, playing=autoplay, speed=speed)
        self.replay_name = replay_name

    def get_default_screen(self) -> Screen:
        return ReplayScreen()

    async def open(self) -> None:
        chat = self.chat
        chat.set_step_mode(True)
        info = self.cursor.turns[0][0]
        status = chat.status
        status.model, status.ssms = info.model, ", ".join(info.ssms) or "-"
        status.device, status.memory = f"{info.device} ({info.quant})", f"replay of {self.replay_name}"
        chat.set_replay_bar(self.cursor.describe())
        if self.cursor.playing:
            self.set_timer(0.05, self.replay_tick)

    # ---- playing
    async def replay_tick(self, schedule: bool = True) -> None:
        cursor = self.cursor
        if cursor.done:
            cursor.playing = False
        elif schedule and not cursor.playing:
            return
        else:
            info, event, starts = cursor.next()
            if starts:
                await self.chat.end_turn()
                await self.chat.begin_turn(info.prompt, info.ssms, info.temperature == 0, info.quant)
            if event is not None:
                self.post_message(StepArrived(event))
            if schedule and cursor.playing:
                self.set_timer(cursor.delay(event), self.replay_tick)
        self.chat.set_replay_bar(cursor.describe())

    async def on_step_arrived(self, message: StepArrived) -> None:
        self.chat.add_step(message.event)
        await self.chat.flush()  # every step is drawn as it comes
        if message.event.finished:
            await self.chat.end_turn(message.event.stop_reason)

    async def play_to_end(self) -> None:
        """Feed every remaining recorded step at once (tests)."""
        self.cursor.playing = False
        while not self.cursor.done:
            await self.replay_tick(schedule=False)

    # ---- keys
    def action_replay_toggle(self) -> None:
        cursor = self.cursor
        if not cursor.done:
            cursor.playing = not cursor.playing
            if cursor.playing:
                self.set_timer(0.01, self.replay_tick)
            self.chat.set_replay_bar(cursor.describe())

    def action_replay_speed(self, factor: float) -> None:
        self.cursor.speed = min(max(self.cursor.speed * factor, 0.125), 64)
        self.chat.set_replay_bar(self.cursor.describe())

    def action_stop(self) -> None:
        self.cursor.playing = False
        self.chat.set_replay_bar(self.cursor.describe())

    def action_next_step(self) -> None:
        self.cursor.playing = False
        self.call_later(self.replay_tick, False)

    def refuse_change(self, kind) -> None:
        """e, r, n on a message: a replay is browsed and copied, never changed."""
        if self.focused_message(kind) is not None:
            self.notify("a replay cannot be changed (c copies a message)", severity="warning")

    def action_edit_message(self) -> None:
        self.refuse_change(UserBlock)

    def action_regenerate(self) -> None:
        self.refuse_change(AnswerBlock)

    action_continue_answer = action_regenerate

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Play / pause", "Replay: play or pause", self.action_replay_toggle)
