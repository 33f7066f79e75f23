"""A fake engine process: no model, the real channel (engine/channel.py), scripted misbehaviour.

`serve` is an EngineWorker entry point; `LoadRequest.model` picks the script:
    "fake"        answers each turn with WORDS, one StepEvent per word, honouring Stop and step mode
    "garbage"     like fake, but first sends unreadable bytes, unknown objects and malformed messages
    "die:K"       like fake, but the first turn dies (exit code 3) after K steps, logging why
    "stall"       answers two steps of its first turn, then hangs, deaf to everything
    "late"        ignores Stop: a turn the parent gave up still sends all its steps and its Done
"""

from __future__ import annotations

import os
import sys
import time

from spectui.engine.channel import Loaded, Progress, serve_turns
from spectui.engine.events import StepEvent
from spectui.engine.worker import ModelInfo

WORDS = ["alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta"]


def event(step: int, text: str, last: bool, stopped: bool = False) -> StepEvent:
    return StepEvent(
        step=step, tree=[], accepted=[], bonus_token=step, bonus_text=text, new_tokens=[step], new_text=text,
        token_origins=["verifier"], drafted=0, accepted_count=0, draft_ms=0.0, verify_ms=1.0,
        attention_backend="fake", total_tokens=step + 1, finished=last or stopped,
        stop_reason="stopped" if stopped else ("length" if last else None),
    )


def words_for(prompt: str) -> list[str]:
    return [f"{prompt}:{w}" for w in WORDS]


def serve(conn, request) -> None:
    script = request.run.model
    sys.stderr = open(request.log_file, "a", buffering=1) if request.log_file else sys.stderr
    conn.send(Progress("faking", 0.5))
    conn.send(Loaded(ModelInfo(model=script, speculators=[], device="cpu", quant="none",
                               attention_backend="fake", pid=os.getpid())))
    state = {"turns": 0}

    def answer(message, control):
        state["turns"] += 1
        words = words_for(message.turns[-1][1])
        if script == "garbage":
            conn.send_bytes(b"\x80\x04 not a pickle")
            conn.send(("step", "an old tuple message"))
            conn.send({"turn": message.turn})
        for k, text in enumerate(words):
            last = k == len(words) - 1
            if script.startswith("die:") and state["turns"] == 1 and k == int(script[4:]):
                print("fake engine: out of memory in step", k, file=sys.stderr, flush=True)
                os._exit(3)
            if script == "stall" and state["turns"] == 1 and k == 2:
                time.sleep(3600)
            time.sleep(0.02)
            stopped = script != "late" and not last and control.is_set()
            yield event(k, text, last, stopped)
            if stopped:
                return

    serve_turns(conn, answer)
