"""EngineLink: the app's side of the engine process, its lifecycle and its turns.

One link per app. States: "off" (nothing started), "starting" (a loader thread waits for the
models), "ready", "failed" (loading failed), "dead" (the process went away, mid-answer or idle).
`start` does nothing unless the state is off, failed or dead, so Retry / Restart pressed twice,
or while loading, starts one engine, never two. Restarting is always explicit (`start`).
`switch` closes the engine, ready or still loading, and aims the next `start` at another model
(the model picker); a load it overtook posts nothing more.

Everything crosses to the app as messages (messages.py): LoadProgress, ModelsLoaded,
LoadFailed while starting; StepArrived per verifier step and one TurnFinished per turn, which
carries the streamed (possibly partial) reply whatever ended the turn; EngineLost when the
process is found gone between turns (`check`, polled by the app).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import replace

from . import paths
from .engine import Conversation, EngineDied, EngineWorker, LoadRequest, RunInfo, RunSpec, WorkerError, write_trace
from .messages import EngineLost, LoadFailed, LoadProgress, ModelsLoaded, StepArrived, TurnFinished


class EngineLink:
    def __init__(self, app, run: RunSpec, trace=None, threads: int | None = None) -> None:
        """run: what to load (each turn brings the app's settings of the moment)."""
        self.app = app
        self.request = LoadRequest(run, log_file=str(paths.engine_log_file()), cost_cache=str(paths.costs_dir()),
                                   models_dir=str(paths.models_dir()), threads=threads)
        self.trace = trace
        self.state = "off"
        self.worker: EngineWorker | None = None  # the ready engine
        self.loading: EngineWorker | None = None  # the engine being loaded
        self.info = None
        self.reason: str | None = None  # why the state is failed or dead
        self.starts = 0  # engine processes started by this link
        self.attempt = 0  # the newest start or switch: a load thread of an older one posts nothing
        self.generating = False
        self._lock = threading.Lock()
        self._closed = False

    # ---- lifecycle
    def start(self) -> bool:
        """Start an engine process unless one is starting or running; True when one was started."""
        with self._lock:
            if self._closed or self.state in ("starting", "ready"):
                return False
            self.state, self.reason = "starting", None
            self.starts += 1
            self.attempt += 1
            attempt = self.attempt
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        # a daemon thread, not a Textual worker: ctrl+q must not wait for a long first fetch
        threading.Thread(target=self._load, args=(attempt, self.request), name="spectui-load", daemon=True).start()
        return True

    def switch(self, model: str, speculators: str) -> None:
        """Close the engine (ready or loading) and aim the next `start` at this model and speculators."""
        with self._lock:
            workers = [w for w in (self.worker, self.loading) if w is not None]
            self.worker = self.loading = self.info = None
            self.state, self.reason = "off", None
            self.attempt += 1
            self.request = replace(self.request, run=replace(self.request.run, model=model, ssms=(), speculators=speculators))
        # closing a loading process waits for it up to 2 s: not on the UI thread
        threading.Thread(target=lambda: [w.close() for w in workers], name="spectui-close", daemon=True).start()

    def _load(self, attempt: int, request: LoadRequest) -> None:
        def progress(stage: str, fraction: float | None = None) -> None:
            if attempt == self.attempt:
                self.app.post_message(LoadProgress(stage, fraction))

        progress("starting the engine process", None)
        worker = info = error = None
        try:
            worker = EngineWorker(request)
            if self._settle(attempt, loading=worker):
                info = worker.wait_loaded(progress)
        except (WorkerError, OSError) as exc:  # shown in the app, which keeps running
            error = str(exc)
        if error is not None and self._settle(attempt, state="failed", reason=error):
            self.app.post_message(LoadFailed(error))
        elif info is not None and self._settle(attempt, worker=worker, info=info, state="ready"):
            self.app.post_message(ModelsLoaded(info, worker))
        elif worker is not None:
            worker.close()  # overtaken by a switch, or the app closed

    def _settle(self, attempt: int, **changes) -> bool:
        """Set these attributes (and clear `loading`, unless given) when this load is still the newest
        attempt; False when a switch or close overtook it."""
        with self._lock:
            if attempt != self.attempt or self._closed:
                return False
            self.loading = None
            for name, value in changes.items():
                setattr(self, name, value)
            return True

    def check(self) -> None:
        """Between turns: post EngineLost once when the ready engine's process has gone."""
        if self.state == "ready" and not self.generating and self.worker is not None:
            died = self.worker.check()
            if died is not None:
                self._dead(died)
                self.app.post_message(EngineLost(str(died)))

    def _dead(self, died: EngineDied) -> None:
        with self._lock:
            if self.state == "ready":
                self.state, self.reason = "dead", str(died)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = [w for w in (self.worker, self.loading) if w is not None]
        for worker in workers:
            worker.close()

    # ---- turns
    def begin_turn(self, record, history, text: str, settings, ssms: list[str]) -> None:
        self.generating = True
        self.worker.set_step_mode(self.app.config.step_mode)
        self.app.run_worker(lambda: self._turn(record, history, text, settings, ssms), thread=True,
                            exclusive=True, group="generate")

    def _turn(self, record, history, text: str | None, settings, ssms: list[str]) -> None:
        """text: the user's new message; None: the last answer in `history` goes on."""
        conversation = Conversation(system=record.system)
        for message in history:
            if message.content:
                conversation.add(message.role, message.content)
        if text is not None:
            conversation.add("user", text)
        before = conversation.messages[-1].content if conversation.continues else ""
        last, error, died = None, None, False
        try:
            with contextlib.ExitStack() as stack:
                events = self.worker.chat(conversation, settings)
                stack.callback(events.close)
                if self.trace is not None:
                    info = self.info
                    run = RunInfo(
                        model=info.model, ssms=ssms, device=info.device, quant=info.quant,
                        attention_backend=info.attention_backend, system=record.system,
                        prompt=text if text is not None else "(continue)",
                        temperature=settings.temperature, top_p=settings.top_p,
                        tree_shape=settings.tree_shape if settings.auto else list(settings.tree_shape),
                        max_new_tokens=settings.max_new_tokens, merge=settings.merge,
                    )
                    events = write_trace(stack.enter_context(open(self.trace, "a", encoding="utf-8")), run, events)
                for event in events:
                    last = event
                    self.app.post_message(StepArrived(event))
        except EngineDied as exc:
            error, died = str(exc), True
            self._dead(exc)
        except Exception as exc:  # noqa: BLE001 - shown in the app; the partial answer is kept
            error = str(exc) if isinstance(exc, WorkerError) else f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            reply = conversation.messages[-1].content[len(before):] if conversation.continues else ""  # this turn's text
            self.generating = False
            reason = last.stop_reason if last is not None else None
            self.app.post_message(TurnFinished(reply, reason, error, died))

    def stop(self) -> None:
        if self.generating and self.worker is not None:
            self.worker.request_stop()

    def advance(self) -> None:
        if self.worker is not None:
            self.worker.advance()

    def set_step_mode(self, on: bool) -> None:
        if self.worker is not None and self.state == "ready":
            self.worker.set_step_mode(on)
