"""EngineWorker: the models and the speculation engine in a child process of their own.

Why a process: the engine's Python glue (one call per layer and op) needs the GIL between the
torch kernels. A UI thread in the same process that lays out and draws takes the GIL for
milliseconds at a time, and every one of those stalls the engine. In its own process the
engine keeps its core and the UI keeps the other (docs/performance.md, "App throughput").

The child is forked from multiprocessing's fork server (`engine_context`), a fresh interpreter
that has already imported torch and transformers: no forked locks or threads of the app's, and a
restart (after a crash, on a model switch) skips their ~4 s of imports; the server's output goes
to /dev/null, never to the app's terminal. The child takes the parent's
environment as it is when it starts, sends nothing to the terminal (its stdout and stderr go to a
log file) and ignores SIGINT: the parent owns the terminal.

The parent and the child talk over one typed channel (engine/channel.py): every turn has an
id, Stop and Advance name the turn they are for, replies of any other turn are dropped as
stale, garbage is counted and dropped. When the child dies (or does not stop within
`stop_grace_s` of a Stop) the turn ends with EngineDied, which says the exit code and the last
line the child logged; the streamed part of the answer is still added to the conversation.
A dead worker stays dead: restarting is the caller's choice (a new EngineWorker).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from .channel import (
    TO_PARENT, Advance, Chat, Done, Garbage, Loaded, LoadFailed, Progress, Quit, Rejected, Step,
    StepMode, Stop, receive, serve_turns,
)
from .chat import Conversation
from .events import StepEvent
from .settings import GenerationSettings, RunSpec


@dataclass
class LoadRequest:
    run: RunSpec  # what to load (each turn sends its own settings: the app's change between turns)
    threads: int | None = None  # torch threads in the child; None: every core (engine_threads)
    log_file: str | None = None  # where the child's stdout and stderr go (None: a temporary file)
    cost_cache: str | None = None  # folder of measured cost models (None: measure at every start)
    models_dir: str | None = None  # the model cache (None: local model folders only; engine/loading.py)


@dataclass
class ModelInfo:
    """What the UI shows about the loaded models (picklable; no tensors)."""

    model: str
    speculators: list[str]
    device: str
    quant: str
    attention_backend: str
    pid: int = 0


class WorkerError(RuntimeError):
    """The engine process failed a turn or went away; the message is the reason."""


class EngineDied(WorkerError):
    """The engine process is gone: restart it to go on. `exit_code` and `log_tail` say how."""

    def __init__(self, message: str, exit_code: int | None = None, log_tail: list[str] | None = None):
        super().__init__(message)
        self.exit_code, self.log_tail = exit_code, log_tail or []


def engine_threads(requested: int | None) -> int:
    """Torch threads for the engine: every core. Measured with `spectui tui-bench --engine-threads`
    on the 2-core machine (docs/performance.md): the app answered at 52.7-53.3 tokens/s with 2
    engine threads against 48.4-49.5 with 1 (one core left to the UI), the UI costing 1-5 %."""
    if requested:
        return requested
    return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------- child side
def _start(serve: Callable, conn, request: LoadRequest, environment: dict[str, str]) -> None:
    """The child's entry: the parent's environment of now (the fork server's is that of its own
    start), then `serve`."""
    os.environ.clear()
    os.environ.update(environment)
    serve(conn, request)


def _serve(conn, request: LoadRequest) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _redirect_output(request.log_file)
    try:
        models, engine = _load(conn, request)
    except Exception as exc:  # noqa: BLE001 - reported to the UI, which keeps running
        conn.send(LoadFailed(f"{type(exc).__name__}: {exc}".splitlines()[0]))
        return
    conn.send(Loaded(ModelInfo(
        model=models.preset.name, speculators=engine.speculator_names, device=models.device,
        quant=models.quant, attention_backend=models.attention_backend, pid=os.getpid(),
    )))

    def answer(message: Chat, control) -> Iterator[StepEvent]:
        from .chat import chat_turn

        conversation = Conversation(system=message.system)
        for role, content in message.turns:
            conversation.add(role, content)
        return chat_turn(engine, models, conversation, message.settings, control)

    serve_turns(conn, answer)


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
        conn.send(Progress(stage, fraction))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_engine(request.run, progress, Path(request.cost_cache) if request.cost_cache else None,
                           Path(request.models_dir) if request.models_dir else None)


# ---------------------------------------------------------------- parent side
# what the fork server imports once, so that each engine process starts with them (~4 s a start)
PRELOAD = ("torch", "transformers.modeling_utils", "transformers.models.llama.modeling_llama", f"{__package__}.preload")


def engine_context():
    """The multiprocessing context engine processes start in: the fork server where the platform has
    one (Linux, macOS), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def prepare_engine_process() -> None:
    """Start multiprocessing's resource tracker and the fork server now, while sys.stderr is still a
    real file (the server imports its modules meanwhile, beside the app's own start).

    Both are spawned with stderr's descriptor; inside a running Textual app stderr is Textual's
    capture object, and the spawn would fail."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    if engine_context().get_start_method() == "forkserver":
        with _output_to_devnull():  # what its imports print must not reach the app's terminal
            forkserver.ensure_running()


@contextlib.contextmanager
def _output_to_devnull():
    """Descriptors 1 and 2 on /dev/null meanwhile: a process spawned now inherits them, not the terminal."""
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # closed descriptors: nothing to protect
        yield
        return
    for stream in (sys.stdout, sys.stderr):  # what is buffered goes out first, to the terminal
        if stream is not None:
            stream.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


class EngineWorker:
    """The parent's handle: start, wait for the models, run turns, stop, close.

    `serve` is the child's entry point (tests pass a fake engine speaking the same channel)."""

    def __init__(self, request: LoadRequest, serve: Callable = _serve, poll_s: float = 0.1,
                 stop_grace_s: float = 10.0) -> None:
        context = engine_context()
        self.own_log = request.log_file is None
        if self.own_log:
            handle, name = tempfile.mkstemp(prefix="spectui-engine-", suffix=".log")
            os.close(handle)
            request = replace(request, log_file=name)
        self.request = request
        self.log_start = _size(request.log_file)
        self.poll_s, self.stop_grace_s = poll_s, stop_grace_s
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_start, name="spectui-engine", daemon=True,
                                       args=(serve, child_conn, request, dict(os.environ)))
        self.process.start()
        child_conn.close()
        self.info: ModelInfo | None = None
        self.turn = 0  # the id of the newest turn
        self.step_mode = False
        self.dead: EngineDied | None = None
        self.stale = self.garbage = 0  # dropped: replies of other turns, unreadable messages
        self.rejected: list[str] = []  # what the child said it could not use
        self._send_lock = threading.Lock()
        self._stop_asked: float | None = None

    def wait_loaded(self, progress: Callable[[str, float | None], None] | None = None) -> ModelInfo:
        """Block until the models are loaded; WorkerError with the reason when they cannot be."""
        while True:
            message = self._receive()
            if isinstance(message, Progress):
                if progress is not None:
                    progress(message.stage, message.fraction)
            elif isinstance(message, Loaded):
                self.info = message.info
                return self.info
            elif isinstance(message, LoadFailed):
                self.close()
                raise WorkerError(message.reason)
            else:
                self._drop(message)

    def chat(self, conversation: Conversation, settings: GenerationSettings) -> Iterator[StepEvent]:
        """One assistant turn, like engine.chat.chat_turn; the (partial) reply is added to the conversation
        (or to its last answer, when the turn continues that) however the turn ends: done, failed, engine
        gone, or the caller stopped reading.

        Raises WorkerError after the last event when the turn failed in the engine, EngineDied
        when the engine process went away."""
        if self.dead is not None:
            raise self.dead
        self.turn += 1
        turn, streamed, finished, error = self.turn, [], False, None
        self._stop_asked = None
        turns = tuple((m.role, m.content) for m in conversation.messages)
        try:
            self._send(Chat(turn, conversation.system, turns, settings, self.step_mode), strict=True)
            while not finished:
                message = self._receive()
                if isinstance(message, (Step, Done)) and message.turn == turn:
                    if isinstance(message, Step):
                        streamed.append(message.event.new_text)
                        yield message.event
                    else:
                        finished, error = True, message.error
                        streamed = [message.reply]
                elif isinstance(message, Rejected) and message.turn == turn:
                    finished, error = True, f"the engine rejected the turn: {message.reason}"
                    self.rejected.append(message.reason)
                else:
                    self._drop(message)
        finally:
            conversation.take_reply("".join(streamed))
            if not finished and self.dead is None:
                self._send(Stop(turn))  # abandoned: its late replies will be dropped as stale
        if error:
            raise WorkerError(error)

    def set_step_mode(self, on: bool) -> None:
        self.step_mode = on
        self._send(StepMode(on))

    def advance(self) -> None:
        self._send(Advance(self.turn))

    def request_stop(self) -> None:
        if self._stop_asked is None:
            self._stop_asked = time.monotonic()
        self._send(Stop(self.turn))

    def check(self) -> EngineDied | None:
        """EngineDied when the process has gone (between turns too), else None."""
        if self.dead is None and not self.process.is_alive():
            self._died()
        return self.dead

    def close(self) -> None:
        if self.process.is_alive():
            self._send(Quit())
            self.process.join(timeout=2)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=2)
        self.conn.close()
        if self.own_log:
            Path(self.request.log_file).unlink(missing_ok=True)

    # ---- the channel
    def _send(self, message, strict: bool = False) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, ValueError):
            if strict:
                raise self._died() from None

    def _receive(self):
        while True:
            if self.dead is not None:
                raise self.dead
            try:
                if self.conn.poll(self.poll_s):
                    return receive(self.conn, TO_PARENT)
            except (EOFError, OSError):
                raise self._died() from None
            if not self.process.is_alive():
                raise self._died()
            if self._stop_asked is not None and time.monotonic() - self._stop_asked > self.stop_grace_s:
                self.process.kill()
                raise self._died(f"the engine process did not stop within {self.stop_grace_s:g} s and was ended")

    def _drop(self, message) -> None:
        if isinstance(message, Garbage):
            self.garbage += 1
        elif isinstance(message, Rejected):
            self.rejected.append(message.reason)
        else:
            self.stale += 1

    def _died(self, reason: str | None = None) -> EngineDied:
        if self.dead is None:
            self.process.join(timeout=2)
            code = self.process.exitcode
            tail = log_tail(self.request.log_file, self.log_start)
            text = reason or f"the engine process exited ({describe_exit(code)})"
            if tail:
                text += f"; its last log line: {tail[-1][:160]}"
            if not self.own_log:
                text += f"; see {self.request.log_file}"
            self.dead = EngineDied(text, code, tail)
        return self.dead


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def log_tail(path: str | None, start: int = 0, lines: int = 5) -> list[str]:
    """The last non-empty lines the child wrote to its log since `start` (a byte offset)."""
    if not path:
        return []
    try:
        with open(path, "rb") as log:
            log.seek(max(start, _size(path) - 8192))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()][-lines:]

