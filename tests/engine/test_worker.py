"""EngineWorker: the engine in its own process gives the same tokens as in this one, and fails cleanly.

The real engine's side of the channel; the parent's side against a misbehaving fake is test_channel.py."""

from __future__ import annotations

import pytest
from background_turn import BackgroundTurn, ask

from spectui import paths
from spectui.engine.chat import chat_turn
from spectui.engine.loading import build_engine
from spectui.engine.settings import GenerationSettings, RunSpec
from spectui.engine.channel import Stop
from spectui.engine.worker import EngineDied, EngineWorker, LoadRequest, WorkerError, prepare_engine_process

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def worker(embedded_dir):
    prepare_engine_process()
    worker = EngineWorker(LoadRequest(RunSpec("smollm2-135m"), models_dir=str(paths.models_dir())))
    worker.wait_loaded()
    yield worker
    worker.close()


def test_worker_matches_the_engine_in_this_process(worker, embedded_models):
    settings = GenerationSettings(max_new_tokens=24, tree_shape=(1, 1, 1))  # a fixed tree: the same steps in both processes
    here = ask(QUESTION)
    local = [e.new_tokens for e in chat_turn(build_engine(embedded_models), embedded_models, here, settings)]
    there = ask(QUESTION)
    remote = [e.new_tokens for e in worker.chat(there, settings)]
    assert remote == local  # same steps, same tokens: StepEvents cross the pipe whole
    assert there.messages[-1].role == "assistant" and there.messages[-1].content == here.messages[-1].content
    assert "Paris" in there.messages[-1].content
    info = worker.info
    assert info.model == "smollm2-135m" and info.quant == "nf4" and info.speculators == ["smollm2-feature", "ngram"] and info.pid > 0


def test_a_failed_turn_keeps_the_worker(worker):
    too_long = GenerationSettings(max_new_tokens=10**6)  # leaves no room for the prompt in the context window
    conversation = ask(QUESTION)
    with pytest.raises(WorkerError, match="ContextError"):
        list(worker.chat(conversation, too_long))
    assert conversation.messages[-1].role == "assistant"  # an empty reply, but the turn is recorded
    again = ask(QUESTION)
    events = list(worker.chat(again, GenerationSettings(max_new_tokens=4)))
    assert events[-1].finished and events[-1].total_tokens == 4


def test_stop_is_honoured_within_a_step(worker):
    conversation = ask("Write a long story about a dragon who learns to cook.")
    events = []
    for event in worker.chat(conversation, GenerationSettings(max_new_tokens=300)):
        events.append(event)
        if len(events) == 3:
            worker.request_stop()
    assert events[-1].stop_reason == "stopped"
    assert len(events) <= 5 and events[-1].total_tokens < 300
    assert conversation.messages[-1].content == "".join(e.new_text for e in events)


def test_step_mode_waits_for_advance(worker):
    worker.set_step_mode(True)
    try:
        turn = BackgroundTurn(worker, ask(QUESTION), GenerationSettings(max_new_tokens=12))
        assert turn.wait_for(1, 60) == 1 and turn.count_after(1.0) == 1  # paused after the prefill step
        worker.advance()
        assert turn.wait_for(2, 60) == 2 and turn.count_after(1.0) == 2
    finally:
        worker.set_step_mode(False)  # releases the paused turn
    assert turn.done.wait(60) and turn.events[-1].finished


def test_loading_failure_is_one_line(embedded_dir, tmp_path):
    prepare_engine_process()
    worker = EngineWorker(LoadRequest(RunSpec(str(tmp_path / "no-such-model"))))
    with pytest.raises(WorkerError, match="no such file or folder") as failure:
        worker.wait_loaded()
    assert "\n" not in str(failure.value)
    assert not worker.process.is_alive()


def test_the_real_engine_answers_garbage_and_stale_control_and_goes_on(worker):
    rejected = len(worker.rejected)
    worker.conn.send(("chat", None, [("user", "an old-protocol tuple")]))
    worker.conn.send_bytes(b"\x80\x04 not a pickle")
    worker.conn.send(Stop(turn=worker.turn + 50))  # another turn's stop: dropped, not carried into this one
    conversation = ask(QUESTION)
    events = list(worker.chat(conversation, GenerationSettings(max_new_tokens=8)))
    assert events[-1].finished and events[-1].stop_reason != "stopped" and events[-1].total_tokens == 8
    assert len(worker.rejected) == rejected + 2 and all("cannot use" in r for r in worker.rejected[rejected:])
    assert worker.process.is_alive()


def test_an_abandoned_turn_does_not_leak_into_the_next(worker):
    first = ask("Write a long story about a dragon who learns to cook.")
    events = worker.chat(first, GenerationSettings(max_new_tokens=200))
    got = [next(events), next(events)]
    events.close()  # the caller stops reading: the engine is told to stop that turn
    assert first.messages[-1].content == "".join(e.new_text for e in got)
    second = ask(QUESTION)
    answer = list(worker.chat(second, GenerationSettings(max_new_tokens=16, tree_shape=(1, 1, 1))))
    assert answer[0].step == 0 and answer[-1].finished  # this turn's steps only, from its prefill on
    assert "Paris" in second.messages[-1].content and "dragon" not in second.messages[-1].content.lower()


def test_a_dead_engine_process_is_reported(embedded_dir, tmp_path):
    prepare_engine_process()
    log = tmp_path / "engine.log"
    log.write_text("an earlier engine's line\n")
    worker = EngineWorker(LoadRequest(RunSpec("smollm2-135m"), log_file=str(log), models_dir=str(paths.models_dir())))
    worker.wait_loaded()
    conversation = ask("Write a long story about a dragon who learns to cook.")
    streamed = []
    with pytest.raises(EngineDied, match="engine process exited") as failure:
        for event in worker.chat(conversation, GenerationSettings(max_new_tokens=200)):
            streamed.append(event.new_text)
            if len(streamed) == 2:
                with open(log, "a") as out:
                    out.write("the child's last words\n")
                worker.process.kill()
    assert failure.value.exit_code == -9 and "killed by SIGKILL" in str(failure.value)
    assert "the child's last words" in str(failure.value) and str(log) in str(failure.value)
    assert "an earlier engine's line" not in failure.value.log_tail  # only this engine's lines
    assert conversation.messages[-1].content == "".join(streamed) and len(streamed) >= 2  # nothing streamed is lost
    with pytest.raises(EngineDied):
        list(worker.chat(ask(QUESTION), GenerationSettings(max_new_tokens=4)))
    worker.close()
