"""The typed channel between the app and the engine process: one Pipe, one message class each way.

Every message is a small picklable dataclass (each class below says what it asks or tells).
Turn-scoped messages carry the turn id the parent chose (1, 2, 3, ... per EngineWorker); a reply
whose turn is not the one being read is stale (left over from a stopped or abandoned turn) and is
dropped, never read as the current turn's.

    parent -> child   Chat, Stop, Advance, StepMode, Quit   (TO_CHILD)
    child -> parent   Progress, Loaded | LoadFailed, Step, Done, Rejected   (TO_PARENT)

Only `receive` unpickles, so garbage on the wire (bytes that do not unpickle, or objects of no
known class) becomes a `Garbage` value the reader can count and drop, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .events import StepEvent
from .settings import GenerationSettings


# ---------------------------------------------------------------- parent -> child
@dataclass(frozen=True)
class Chat:
    """Start a turn: answer the last of `turns` (role, content), the user's."""

    turn: int
    system: str | None
    turns: tuple[tuple[str, str], ...]  # (role, content), the last one the user's
    settings: GenerationSettings
    step_mode: bool = False


@dataclass(frozen=True)
class TurnOrder:
    """An order about one turn (a subclass says which); stale when its turn is not the current one."""

    turn: int


class Stop(TurnOrder):
    """End that turn after the current verifier step."""


class Advance(TurnOrder):
    """Step mode: go on to that turn's next verifier step."""


@dataclass(frozen=True)
class StepMode:
    """Pause after every verifier step from now on (or stop pausing)."""

    on: bool


@dataclass(frozen=True)
class Quit:
    """Leave: the child exits its loop."""


# ---------------------------------------------------------------- child -> parent
@dataclass(frozen=True)
class Progress:
    """Loading: the stage under way and, where known, how far (0-1)."""

    stage: str
    fraction: float | None = None


@dataclass(frozen=True)
class Loaded:
    """The models are loaded; `info` says what was loaded."""

    info: Any  # worker.ModelInfo


@dataclass(frozen=True)
class LoadFailed:
    """Loading failed; `reason` is one line for the user."""

    reason: str


@dataclass(frozen=True)
class Step:
    """One verifier step of that turn."""

    turn: int
    event: StepEvent


@dataclass(frozen=True)
class Done:
    """The end of a turn: its reply, kept even when `error` says the turn failed."""

    turn: int
    reply: str
    error: str | None = None


@dataclass(frozen=True)
class Rejected:
    """The answer to a message the child cannot use (unknown, malformed, a Chat while busy):
    it says so and keeps serving."""

    turn: int | None
    reason: str


@dataclass(frozen=True)
class Garbage:
    """Not a message: what `receive` returns for anything it cannot read."""

    what: str


TO_CHILD = (Chat, Stop, Advance, StepMode, Quit)
TO_PARENT = (Progress, Loaded, LoadFailed, Step, Done, Rejected)


def receive(conn, kinds: tuple[type, ...]):
    """One message of the given classes, or Garbage; EOFError/OSError when the other side is gone."""
    try:
        message = conn.recv()
    except (EOFError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - unpickling garbage raises anything
        return Garbage(f"unreadable ({type(exc).__name__})")
    if not isinstance(message, kinds):
        return Garbage(f"unknown message {short(message)}")
    if not _well_formed(message):
        return Garbage(f"malformed {short(message)}")
    return message


def _well_formed(message) -> bool:
    turn = getattr(message, "turn", 0)
    if not (turn is None and isinstance(message, Rejected)) and not isinstance(turn, int):
        return False
    if isinstance(message, Step):
        return isinstance(message.event, StepEvent)
    if isinstance(message, Chat):
        return isinstance(message.settings, GenerationSettings) and all(
            isinstance(t, tuple) and len(t) == 2 for t in message.turns
        )
    if isinstance(message, Done):
        return isinstance(message.reply, str)
    return True


def short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- child side
class TurnControl:
    """The child's end of the channel while it serves turns.

    The engine checks `is_set()` between verifier steps (it is the `stop` it is given): that
    reads whatever the parent sent meanwhile, so Stop and Advance act on the turn they name and
    on no other. A Chat that arrives during a turn means the parent gave the current one up: it
    stops it and runs next. Anything unreadable is answered with Rejected; the child goes on."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.turn: int | None = None
        self.stopped = False
        self.advances = 0
        self.step_mode = False
        self.quit = False
        self.pending: list[Chat] = []

    def begin(self, message: Chat) -> None:
        self.turn, self.stopped, self.advances = message.turn, False, 0
        self.step_mode = message.step_mode

    def end(self) -> None:
        self.turn = None

    def is_set(self) -> bool:
        self.drain()
        return self.stopped

    def drain(self, timeout: float = 0.0) -> None:
        while self.conn.poll(timeout):
            timeout = 0.0
            self.handle(receive(self.conn, TO_CHILD))

    def handle(self, message) -> None:
        if isinstance(message, Chat):
            self.pending.append(message)
            self.stopped = self.stopped or self.turn is not None
        elif isinstance(message, Stop):
            self.stopped = self.stopped or message.turn == self.turn  # another turn's: stale, dropped
        elif isinstance(message, Advance):
            if message.turn == self.turn:
                self.advances += 1
        elif isinstance(message, StepMode):
            self.step_mode = bool(message.on)
        elif isinstance(message, Quit):
            self.quit = self.stopped = True
        else:
            self.conn.send(Rejected(self.turn, f"the engine cannot use {message.what}"))

    def wait_advance(self) -> None:
        """Step mode: pause until this turn's Advance, a stop, or step mode off."""
        while self.step_mode and not self.advances and not self.stopped:
            self.drain(0.05)
        self.advances = max(0, self.advances - 1)

    def next_chat(self) -> Chat | None:
        """Block until the next Chat (None: Quit, or the parent went away)."""
        while not self.pending and not self.quit:
            try:
                self.handle(receive(self.conn, TO_CHILD))
            except (EOFError, OSError):
                return None
        return None if self.quit else self.pending.pop(0)


def serve_turns(conn, answer) -> None:
    """Answer Chats until Quit or the parent goes away. `answer(chat, control)` yields StepEvents
    (the engine's `chat` with `control` as its stop); its failure ends the turn, not the child."""
    control = TurnControl(conn)
    while (message := control.next_chat()) is not None:
        control.begin(message)
        reply, error = [], None
        try:
            for event in answer(message, control):
                reply.append(event.new_text)
                conn.send(Step(message.turn, event))
                if control.step_mode and not event.finished:
                    control.wait_advance()
        except (EOFError, OSError, BrokenPipeError):
            return  # the parent went away
        except Exception as exc:  # noqa: BLE001 - the turn fails, the child and the partial answer stay
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        control.end()
        try:
            conn.send(Done(message.turn, "".join(reply), error))
        except (OSError, ValueError):
            return
