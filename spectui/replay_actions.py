"""ReplayActions: `spectui replay`'s controls, a mixin of SpecTuiApp (app.py).

A ReplayCursor (replay.py) holds the recorded turns; each tick posts the next recorded StepEvent
as the same StepArrived message a live turn posts, so replayed answers are drawn by the chat's
own code path. space plays or pauses, n steps, + and - change the speed.
"""

from __future__ import annotations

from .messages import StepArrived


class ReplayActions:
    async def replay_tick(self, schedule: bool = True) -> None:
        cursor = self.replay_cursor
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

    def action_replay_toggle(self) -> None:
        cursor = self.replay_cursor
        if cursor and not cursor.done:
            cursor.playing = not cursor.playing
            if cursor.playing:
                self.set_timer(0.01, self.replay_tick)
            self.chat.set_replay_bar(cursor.describe())

    def action_replay_speed(self, factor: float) -> None:
        if self.replay_cursor:
            self.replay_cursor.speed = min(max(self.replay_cursor.speed * factor, 0.125), 64)
            self.chat.set_replay_bar(self.replay_cursor.describe())

    async def play_to_end(self) -> None:
        """Feed every remaining recorded step at once (tests, and `--speed 0`)."""
        self.replay_cursor.playing = False
        while not self.replay_cursor.done:
            await self.replay_tick(schedule=False)
