"""EngineWorker: the engine in its own process gives the same tokens as in this one, and fails cleanly."""

from __future__ import annotations

import pytest

from spectui.engine.chat import Conversation, chat
from spectui.engine.loading import build_engine
from spectui.engine.settings import GenerationSettings
from spectui.engine.worker import EngineWorker, LoadRequest, WorkerError, prepare

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def worker(embedded_dir):
    prepare()
    worker = EngineWorker(LoadRequest("smollm2-135m"))
    worker.wait_loaded()
    yield worker
    worker.close()


def ask(text: str) -> Conversation:
    conversation = Conversation()
    conversation.add("user", text)
    return conversation


def test_worker_matches_the_engine_in_this_process(worker, embedded_models):
    settings = GenerationSettings(max_new_tokens=24, tree_shape=(1, 1, 1))  # a fixed tree: the same steps in both processes
    here = ask(QUESTION)
    local = [e.new_tokens for e in chat(build_engine(embedded_models), embedded_models, here, settings)]
    there = ask(QUESTION)
    remote = [e.new_tokens for e in worker.chat(there, settings)]
    assert remote == local  # same steps, same tokens: StepEvents cross the pipe whole
    assert there.messages[-1].role == "assistant" and there.messages[-1].content == here.messages[-1].content
    assert "Paris" in there.messages[-1].content
    info = worker.info
    assert info.model == "smollm2-135m" and info.quant == "nf4" and info.speculators == ["smollm2-boost-1", "smollm2-boost-2", "ngram"] and info.pid > 0


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
    import threading
    import time

    worker.set_step_mode(True)
    try:
        events = []
        done = threading.Event()

        def run():
            for event in worker.chat(ask(QUESTION), GenerationSettings(max_new_tokens=12)):
                events.append(event)
            done.set()

        threading.Thread(target=run, daemon=True).start()
        deadline = time.monotonic() + 60
        while not events and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert len(events) == 1  # paused after the prefill step
        worker.advance()
        deadline = time.monotonic() + 60
        while len(events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert len(events) == 2
    finally:
        worker.set_step_mode(False)  # releases the paused turn
    assert done.wait(60) and events[-1].finished


def test_loading_failure_is_one_line(embedded_dir, tmp_path):
    prepare()
    worker = EngineWorker(LoadRequest(str(tmp_path / "no-such-model")))
    with pytest.raises(WorkerError, match="no such file or folder") as failure:
        worker.wait_loaded()
    assert "\n" not in str(failure.value)
    assert not worker.process.is_alive()


def test_a_dead_engine_process_is_reported(embedded_dir, tmp_path):
    prepare()
    log = tmp_path / "engine.log"
    worker = EngineWorker(LoadRequest("smollm2-135m", log_file=str(log)))
    worker.wait_loaded()
    worker.process.kill()
    worker.process.join(10)
    with pytest.raises(WorkerError, match="engine process exited") as failure:
        list(worker.chat(ask(QUESTION), GenerationSettings(max_new_tokens=4)))
    assert str(log) in str(failure.value)
    worker.close()
