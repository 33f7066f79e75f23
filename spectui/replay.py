"""Replay of a recorded trace: the turns in a trace file and a driver that plays them.

A trace written by `spectui generate --trace` holds one run; `spectui chat --trace` appends one
run per turn. `read_turns` reads and checks the whole file with the engine's `read_runs` (the
trace schema in engine/events.py; TraceError, one clear line naming the line and the field)
before any screen opens: each run line and its steps is one turn. The driver posts each recorded
StepEvent as a StepArrived message, exactly as the live generation worker does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .engine import RunInfo, StepEvent, read_runs

MIN_DELAY_S, MAX_DELAY_S = 0.02, 2.0


def read_turns(path) -> list[tuple[RunInfo, list[StepEvent]]]:
    """(RunInfo, its StepEvents) per turn of the trace at path; TraceError when any line is malformed."""
    return read_runs(path)


@dataclass
class ReplayCursor:
    """Where the replay stands: the next (turn, step) to play, whether playing, and the speed."""

    turns: list[tuple[RunInfo, list[StepEvent]]]
    turn: int = 0
    step: int = 0
    playing: bool = True
    speed: float = 1.0
    started_turns: set = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.turn >= len(self.turns)

    def next(self) -> tuple[RunInfo, StepEvent | None, bool]:
        """-> (run, event or None for an empty turn, whether this starts the turn); advances."""
        info, events = self.turns[self.turn]
        starts = self.turn not in self.started_turns
        self.started_turns.add(self.turn)
        event = events[self.step] if self.step < len(events) else None
        self.step += 1
        if self.step >= len(events):
            self.turn, self.step = self.turn + 1, 0
        return info, event, starts

    def delay(self, event: StepEvent | None) -> float:
        if event is None:
            return MIN_DELAY_S
        seconds = (event.draft_ms + event.verify_ms) / 1000 / self.speed
        return min(max(seconds, MIN_DELAY_S), MAX_DELAY_S)

    def describe(self) -> str:
        total = sum(len(events) for _, events in self.turns)
        played = sum(len(events) for _, events in self.turns[: self.turn]) + self.step
        state = "finished" if self.done else ("▶ playing" if self.playing else "⏸ paused")
        return f"replay {state}  speed {self.speed:g}x  step {played}/{total}   space play/pause · n step · +/- speed"
