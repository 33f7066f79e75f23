"""Pilot tests that drive the real embedded model (SmolLM2-135M, nf4 on CPU) through the app."""

from __future__ import annotations

import pytest

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.screens.loading import LoadingScreen
from spectui.store import Store
from spectui.widgets.acceptance import AcceptanceChart
from spectui.widgets.conversation import AnswerBlock, UserBlock
from spectui.widgets.token_tree import TokenTreeView

from tui_helpers import wait_for

pytestmark = pytest.mark.anyio

QUESTION = "What is the capital of France?"
STORY = "Write a long story about a dragon who learns to cook."
SIZE = (140, 42)


async def ask(app, pilot, text: str) -> None:
    await wait_for(pilot, lambda: app.engine is not None or app.load_error, 300, "the model to load")
    assert app.load_error is None, app.load_error
    assert not isinstance(app.screen, LoadingScreen)
    prompt = app.chat.query_one("#prompt")
    await pilot.click("#prompt")
    prompt.insert(text)
    await pilot.press("enter")
    # a short answer on an idle machine can be complete before the first poll: accept either
    tree = app.chat.query_one(TokenTreeView)
    await wait_for(pilot, lambda: app.generating or len(tree.events) > 0, 10, "generation to start")


async def story_streaming(app, pilot, steps: int) -> TokenTreeView:
    """Ask for a long story and wait for its first `steps` verifier steps: the answer streams on."""
    await ask(app, pilot, STORY)
    tree = app.chat.query_one(TokenTreeView)
    await wait_for(pilot, lambda: len(tree.events) >= steps, 120, "a few steps")
    return tree


@pytest.mark.slow
async def test_answer_tree_chart_and_history_survive_restart(model_home):
    app = ChatApp(overrides={"max_new_tokens": 16})
    async with app.run_test(size=SIZE) as pilot:
        await ask(app, pilot, QUESTION)
        await wait_for(pilot, lambda: not app.generating, 300, "the answer")
        await pilot.pause(0.3)
        answer = app.chat.last_answer()
        assert "Paris" in answer
        tree = app.chat.query_one(TokenTreeView)
        assert len(tree.events) >= 2 and tree.events[-1].finished
        assert tree.index == len(tree.events) - 1
        assert len(app.chat.query_one(AcceptanceChart).rates) == len(tree.events) - 1
        assert "tokens/s" in str(app.chat.query_one("#figures").render())
        assert app.chat.query_one("#prompt").text == ""
        conversation_id = app.record.id
        speculators = app.info.speculators
    # a new app on the same SPECTUI_HOME reopens the conversation, the answer's token origins with it
    store = Store(paths.history_db())
    messages = store.messages(conversation_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert "".join(piece for piece, _ in messages[1].origins) == answer and messages[1].speculators == speculators
    store.close()
    again = ChatApp(autoload=False)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        assert again.record.id == conversation_id
        users = [str(b.render()) for b in again.chat.query(UserBlock)]
        assert users == [QUESTION]
        assert [b.text for b in again.chat.query(AnswerBlock)] == [answer]
        [block] = again.chat.query(AnswerBlock)
        assert block.pieces == messages[1].origins and len(block.coloured().spans) == len(block.pieces)


@pytest.mark.slow
async def test_escape_stops_and_keeps_partial_answer(model_home):
    app = ChatApp(overrides={"max_new_tokens": 400})
    async with app.run_test(size=SIZE) as pilot:
        tree = await story_streaming(app, pilot, 4)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, 30, "generation to stop")
        last = tree.events[-1]
        assert last.stop_reason == "stopped"
        assert last.total_tokens < 400
        await pilot.pause(0.3)
        partial = app.chat.last_answer()
        assert partial
        store = Store(paths.history_db())
        assert store.messages(app.record.id)[-1].content == partial
        store.close()
        assert app.chat.status.state == "stopped"


@pytest.mark.slow
async def test_step_mode_waits_for_the_key(model_home):
    app = ChatApp(overrides={"max_new_tokens": 24}, step_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        await ask(app, pilot, QUESTION)
        tree = app.chat.query_one(TokenTreeView)
        await wait_for(pilot, lambda: len(tree.events) >= 1, 60, "the prefill step")
        await pilot.pause(1.5)
        assert len(tree.events) == 1  # paused after the prefill step
        assert "Prefill" in str(app.chat.query_one("#decision-text").render())
        await pilot.press("f6")
        await wait_for(pilot, lambda: len(tree.events) >= 2, 60, "the next step")
        await pilot.pause(1.0)
        assert len(tree.events) == 2
        assert app.chat.query_one("#decision").display
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, 60, "generation to stop")
        assert tree.events[-1].stop_reason in ("stopped", "eos", "length")


@pytest.mark.slow
async def test_generation_failures_are_shown_and_the_conversation_kept(model_home):
    # max_new_tokens beyond the context window: the engine process fails the turn (ContextError)
    app = ChatApp(overrides={"max_new_tokens": 10**6})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.engine is not None or app.load_error, 300, "the model to load")
        await app.send("Will this work?")
        await wait_for(pilot, lambda: not app.generating, 60, "the failed turn")
        await pilot.pause(0.2)
        notice = str(app.chat.query_one("#notice").render())
        assert "Generation failed" in notice and "ContextError" in notice
        assert app.is_running
        # the engine process dies between turns: noticed, said once, a send is refused (the text stays typed)
        first_pid = app.engine.process.pid
        app.engine.process.kill()
        await wait_for(pilot, lambda: app.link.state == "dead", 10, "the death to be noticed")
        await pilot.pause(0.2)
        notice = str(app.chat.query_one("#notice").render())
        assert "engine process exited (killed by SIGKILL)" in notice and "ctrl+e" in notice
        await pilot.click("#prompt")
        app.chat.query_one("#prompt").insert("And now?")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert not app.generating and app.chat.query_one("#prompt").text == "And now?"
        # ctrl+e restarts it once, however often it is asked; the typed text is then answered
        await pilot.press("ctrl+e")
        app.action_restart_engine()
        assert app.link.starts == 2
        await wait_for(pilot, lambda: app.engine is not None or app.load_error, 300, "the restart")
        assert app.load_error is None and app.engine.process.pid != first_pid
        assert not isinstance(app.screen, LoadingScreen)  # a ready engine means the loading screen is gone
        app.config.max_new_tokens = 8
        await pilot.click("#prompt")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.generating and app.chat.last_answer(), 60, "the answer")
        assert app.is_running
        record_id = app.record.id
    store = Store(paths.history_db())
    messages = store.messages(record_id)
    assert [m.content for m in messages if m.role == "user"] == ["Will this work?", "And now?"]
    assert messages[-1].role == "assistant" and messages[-1].content
    store.close()


@pytest.mark.slow
async def test_engine_killed_mid_answer_saves_the_partial_answer_and_restarts(model_home):
    app = ChatApp(overrides={"max_new_tokens": 300})
    async with app.run_test(size=SIZE) as pilot:
        tree = await story_streaming(app, pilot, 3)
        app.engine.process.kill()
        await wait_for(pilot, lambda: not app.generating, 30, "the turn to end")
        await pilot.pause(0.3)
        streamed = "".join(e.new_text for e in tree.events)
        assert streamed and app.chat.last_answer() == streamed
        notice = str(app.chat.query_one("#notice").render())
        assert "killed by SIGKILL" in notice and "What it streamed is saved" in notice and "Traceback" not in notice
        assert app.chat.status.state == "engine stopped"
        store = Store(paths.history_db())
        assert [(m.role, m.content) for m in store.messages(app.record.id)][-2:] == [
            ("user", STORY), ("assistant", streamed)]
        store.close()
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: app.engine is not None, 300, "the restart")
        assert app.link.starts == 2 and not app.chat.query_one("#notice").display
