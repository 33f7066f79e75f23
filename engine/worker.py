"""EngineWorker: the models and the speculation engine in a child process of their own.

Why a process: the engine's Python glue (one call per layer and op) needs the GIL between the
torch kernels. A UI thread in the same process that lays out and draws takes the GIL for
milliseconds at a time, and every one of those stalls the engine. In its own process the
engine keeps its core and the UI keeps the other (docs/performance.md, "App throughput").

The child is started with "spawn" (no forked locks or threads), sends nothing to the terminal
(its stdout and stderr go to a log file) and ignores SIGINT: the parent owns the terminal.

Protocol, over one Pipe:

    child -> parent   ("progress", stage, fraction)   while loading
                      ("loaded", ModelInfo) | ("failed", reason)
                      ("step", StepEvent) ...          one per verifier step of a turn
                      ("done", reply, error)           the end of a turn (reply kept even on error)
    parent -> child   ("chat", system, [(role, content)], GenerationSettings)
                      ("quit",)

Three shared events steer a running turn: `stop` (the engine honours it within one verifier
step), `step_mode` (pause after each step) and `advance` (go on to the next step).
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .chat import Conversation
from .events import StepEvent
from .settings import GenerationSettings


@dataclass
class LoadRequest:
    model: str
    ssms: tuple[str, ...] = ()
    quant: str = "nf4"
    device: str = "auto"
    threads: int | None = None  # torch threads in the child; None: one core fewer than the machine has
    log_file: str | None = None  # where the child's stdout and stderr go (None: discarded)
    cost_cache: str | None = None  # folder of measured cost models (None: measure at every start)


@dataclass
class ModelInfo:
    """What the UI shows about the loaded models (picklable; no tensors)."""

    model: str
    speculators: list[str]
    device: str
    quant: str
    attention_backend: str
    pid: int = 0
    extra: dict = field(default_factory=dict)


class WorkerError(RuntimeError):
    """The engine process failed or went away; the message is the reason."""


def engine_threads(requested: int | None) -> int:
    """Torch threads for the engine: one core is left to the UI process."""
    if requested:
        return requested
    return max(1, (os.cpu_count() or 1) - 1)


# ---------------------------------------------------------------- child side
def _serve(conn, request: LoadRequest, stop, step_mode, advance) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _redirect_output(request.log_file)
    try:
        models, engine = _load(conn, request)
    except Exception as exc:  # noqa: BLE001 - reported to the UI, which keeps running
        conn.send(("failed", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        return
    conn.send(("loaded", ModelInfo(
        model=models.preset.name, speculators=engine.speculator_names, device=models.device,
        quant=models.quant, attention_backend=models.attention_backend, pid=os.getpid(),
    )))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the UI went away
            return
        if message[0] != "chat":
            return
        _, system, turns, settings = message
        _answer(conn, models, engine, system, turns, settings, stop, step_mode, advance)


def _redirect_output(log_file: str | None) -> None:
    target = os.open(log_file or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


def _load(conn, request: LoadRequest):
    import warnings

    import torch

    from .loading import load_engine

    torch.set_num_threads(engine_threads(request.threads))

    def progress(stage: str, fraction: float | None = None) -> None:
        conn.send(("progress", stage, fraction))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_engine(request.model, request.ssms, request.quant, request.device, progress,
                           Path(request.cost_cache) if request.cost_cache else None)


def _answer(conn, models, engine, system, turns, settings, stop, step_mode, advance) -> None:
    from .chat import chat

    conversation = Conversation(system=system)
    for role, content in turns:
        conversation.add(role, content)
    error = None
    try:
        for event in chat(engine, models, conversation, settings, stop):
            conn.send(("step", event))
            if step_mode.is_set() and not event.finished:
                while not advance.wait(0.05) and not stop.is_set():
                    pass
                advance.clear()
    except Exception as exc:  # noqa: BLE001 - the turn fails, the worker and the partial answer stay
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    last = conversation.messages[-1]
    conn.send(("done", last.content if last.role == "assistant" else "", error))


# ---------------------------------------------------------------- parent side
def prepare() -> None:
    """Start multiprocessing's resource tracker now, while sys.stderr is still a real file.

    The shared events need the tracker, which is spawned with stderr's descriptor; inside a
    running Textual app stderr is Textual's capture object, and the spawn would fail."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


class EngineWorker:
    """The parent's handle: start, wait for the models, run turns, stop, close."""

    def __init__(self, request: LoadRequest) -> None:
        context = multiprocessing.get_context("spawn")
        self.request = request
        self.stop_event, self.step_mode, self.advance_event = context.Event(), context.Event(), context.Event()
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_serve, name="spectui-engine", daemon=True,
            args=(child_conn, request, self.stop_event, self.step_mode, self.advance_event),
        )
        self.process.start()
        child_conn.close()
        self.info: ModelInfo | None = None

    def wait_loaded(self, progress: Callable[[str, float | None], None] | None = None) -> ModelInfo:
        """Block until the models are loaded; WorkerError with the reason when they cannot be."""
        while True:
            kind, *rest = self._receive()
            if kind == "progress" and progress is not None:
                progress(*rest)
            elif kind == "loaded":
                self.info = rest[0]
                return self.info
            elif kind == "failed":
                self.close()
                raise WorkerError(rest[0])

    def chat(self, conversation: Conversation, settings: GenerationSettings) -> Iterator[StepEvent]:
        """One assistant turn, like engine.chat.chat; the (partial) reply is added to the conversation.

        Raises WorkerError after the last event when the turn failed in the engine."""
        self.stop_event.clear()
        self.advance_event.clear()
        turns = [(m.role, m.content) for m in conversation.messages]
        try:
            self.conn.send(("chat", conversation.system, turns, settings))
        except (OSError, ValueError):
            raise self._gone() from None
        while True:
            kind, *rest = self._receive()
            if kind == "step":
                yield rest[0]
            elif kind == "done":
                reply, error = rest
                conversation.add("assistant", reply)
                if error:
                    raise WorkerError(error)
                return

    def set_step_mode(self, on: bool) -> None:
        if on:
            self.step_mode.set()
        else:
            self.step_mode.clear()
            self.advance_event.set()

    def advance(self) -> None:
        self.advance_event.set()

    def request_stop(self) -> None:
        self.stop_event.set()
        self.advance_event.set()

    def close(self) -> None:
        self.request_stop()
        if self.process.is_alive():
            try:
                self.conn.send(("quit",))
            except (OSError, ValueError):
                pass
            self.process.join(timeout=2)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=2)
        self.conn.close()

    def _receive(self) -> tuple:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise self._gone() from None

    def _gone(self) -> WorkerError:
        self.process.join(timeout=1)
        code = self.process.exitcode
        return WorkerError(
            "the engine process exited" + (f" (code {code})" if code not in (None, 0) else "")
            + (f"; see {self.request.log_file}" if self.request.log_file else "")
        )


def default_log_file() -> Path:
    """The engine log in the user cache dir (created)."""
    from ..paths import cache_dir

    folder = cache_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "engine.log"
