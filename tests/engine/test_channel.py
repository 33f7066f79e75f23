"""The engine channel against a fake engine process: a real spawned child speaking engine/channel.py
that sends garbage, dies, stalls and replies late. The real engine's side is in test_worker.py."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import pytest
from background_turn import BackgroundTurn, ask
from fake_engine import WORDS, serve, words_for

from spectui.engine.channel import Advance, Chat, Done, Rejected, Step, Stop
from spectui.engine.settings import GenerationSettings, RunSpec
from spectui.engine.worker import EngineDied, EngineWorker, LoadRequest, prepare_engine_process

SETTINGS = GenerationSettings(max_new_tokens=8)


@contextmanager
def running(script: str, **options) -> Iterator[EngineWorker]:
    """A loaded worker over the fake engine running `script`, closed after the block."""
    prepare_engine_process()
    worker = EngineWorker(LoadRequest(RunSpec(script)), serve=serve, **options)
    try:
        worker.wait_loaded()
        yield worker
    finally:
        worker.close()


def test_a_turn_streams_every_step_and_the_reply():
    with running("fake") as worker:
        conversation = ask("q1")
        texts = [e.new_text for e in worker.chat(conversation, SETTINGS)]
        assert texts == words_for("q1")
        assert conversation.messages[-1].content == "".join(words_for("q1"))
        assert worker.info.model == "fake" and worker.turn == 1


def test_garbage_from_the_engine_is_dropped_and_the_turn_completes():
    with running("garbage") as worker:
        for prompt in ("g1", "g2"):
            conversation = ask(prompt)
            assert [e.new_text for e in worker.chat(conversation, SETTINGS)] == words_for(prompt)
        assert worker.garbage == 6  # three pieces of garbage per turn, none of them taken for a step


def test_unknown_messages_to_the_engine_are_rejected_and_it_keeps_serving():
    with running("fake") as worker:
        worker.conn.send(("chat", "an old-protocol tuple"))
        worker.conn.send_bytes(b"\x80\x04 not a pickle")
        conversation = ask("after")
        assert [e.new_text for e in worker.chat(conversation, SETTINGS)] == words_for("after")
        assert len(worker.rejected) == 2 and all("cannot use" in r for r in worker.rejected)
        assert worker.process.is_alive()


def test_death_mid_turn_keeps_the_streamed_part_and_says_how():
    with running("die:3") as worker:
        conversation = ask("d")
        got = []
        with pytest.raises(EngineDied) as died:
            for event in worker.chat(conversation, SETTINGS):
                got.append(event.new_text)
        assert got == words_for("d")[:3]
        assert conversation.messages[-1].content == "".join(got)  # the partial answer is kept
        assert died.value.exit_code == 3 and "code 3" in str(died.value)
        assert "out of memory in step 3" in str(died.value) and "\n" not in str(died.value)
        with pytest.raises(EngineDied):  # a dead worker stays dead: restarting is explicit
            list(worker.chat(ask("again"), SETTINGS))
        assert worker.check() is died.value


def test_a_stalled_engine_is_ended_after_the_stop_grace():
    with running("stall", stop_grace_s=1.0) as worker:
        conversation = ask("s")
        got = []
        began = time.monotonic()
        with pytest.raises(EngineDied, match="did not stop within 1 s"):
            for event in worker.chat(conversation, SETTINGS):
                got.append(event.new_text)
                if len(got) == 2:
                    worker.request_stop()
        assert time.monotonic() - began < 10
        assert conversation.messages[-1].content == "".join(words_for("s")[:2])
        worker.process.join(5)
        assert not worker.process.is_alive()


def test_late_replies_of_an_abandoned_turn_are_dropped():
    with running("late") as worker:
        first = ask("old")
        events = worker.chat(first, SETTINGS)
        assert next(events).new_text == words_for("old")[0]
        events.close()  # the caller gives the turn up; the engine still sends the rest of it
        assert first.messages[-1].content == words_for("old")[0]
        second = ask("new")
        assert [e.new_text for e in worker.chat(second, SETTINGS)] == words_for("new")
        assert worker.stale == len(WORDS)  # the old turn's remaining steps and its Done


def test_stop_and_advance_act_only_on_their_own_turn():
    with running("fake") as worker:
        worker.set_step_mode(True)
        worker.conn.send(Advance(turn=99))  # another turn's advance must not release this turn
        worker.conn.send(Stop(turn=99))
        turn = BackgroundTurn(worker, ask("p"), SETTINGS)
        assert turn.wait_for(1, 10) == 1 and turn.count_after(0.5) == 1  # paused after the first step
        worker.advance()
        assert turn.wait_for(2, 10) == 2 and turn.count_after(0.5) == 2  # one step a release
        worker.set_step_mode(False)
        assert turn.done.wait(10) and [e.new_text for e in turn.events] == words_for("p")


def test_the_raw_channel_names_the_turn_in_every_reply():
    with running("fake") as worker:
        worker.conn.send(Chat(7, None, (("user", "raw"),), SETTINGS))
        replies = [worker.conn.recv() for _ in WORDS] + [worker.conn.recv()]
        assert all(isinstance(r, Step) and r.turn == 7 for r in replies[:-1])
        assert isinstance(replies[-1], Done) and replies[-1].turn == 7 and replies[-1].reply == "".join(words_for("raw"))
        worker.conn.send(Chat(8, None, (("user", "x"), "not a pair"), SETTINGS))  # malformed: answered, not fatal
        rejected = worker.conn.recv()
        assert isinstance(rejected, Rejected) and "malformed" in rejected.reason
        assert worker.process.is_alive()


def test_what_the_fork_server_prints_never_reaches_the_terminal(tmp_path):
    """The server imports its modules while the app draws: a module that prints at import (as
    bitsandbytes warns) must not write on the app's terminal. A real process, its output captured."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    marker = tmp_path / "imported"
    (tmp_path / "noisy.py").write_text(f"import sys\nprint('noise on stdout')\nprint('noise on stderr', file=sys.stderr)\n"
                                       f"open({str(marker)!r}, 'w').close()\n")
    script = tmp_path / "start.py"
    script.write_text(f"""import sys
sys.path[:0] = [{str(tmp_path)!r}, {str(Path(__file__).parent)!r}]
from fake_engine import serve
from spectui.engine import worker
worker.PRELOAD = (*worker.PRELOAD, "noisy")
if __name__ == "__main__":
    worker.prepare_engine_process()
    engine = worker.EngineWorker(worker.LoadRequest(worker.RunSpec("fake")), serve=serve)
    engine.wait_loaded()
    engine.close()
    print("ready")
""")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the server's sys.path: Python 3.11's ignores the parent's
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert marker.exists()  # the server did import it
    assert result.stdout == "ready\n" and "noise" not in result.stderr, (result.stdout, result.stderr)
