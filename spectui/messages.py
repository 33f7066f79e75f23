"""Messages that worker threads and the replay driver post to the app: small dataclasses.

StepArrived is the only thing the UI consumes from generation; a live turn and a replayed
trace both deliver their StepEvents through it, so they share one screen code path.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from .engine import StepEvent


@dataclass
class StepArrived(Message):
    event: StepEvent


@dataclass
class TurnFinished(Message):
    reply: str  # the (possibly partial) answer, already in the conversation
    stop_reason: str | None
    error: str | None = None  # why generation failed, when it did
    engine_died: bool = False  # the engine process went away during the turn: restart to go on


@dataclass
class LoadProgress(Message):
    stage: str
    fraction: float | None


@dataclass
class ModelsLoaded(Message):
    info: object  # the engine's ModelInfo (engine/worker.py)
    engine: object  # an EngineWorker (or anything with its chat/stop/advance methods)


@dataclass
class LoadFailed(Message):
    reason: str


@dataclass
class EngineLost(Message):
    """The engine process was found gone between turns."""

    reason: str
