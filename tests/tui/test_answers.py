"""Answers and what surrounds them: token origins saved with each answer and coloured again when the
chat reopens; the status line's SSMs when speculation is off; ctrl+n, F2 → open and F2 → delete
while an answer streams (a real engine process on a tiny model): the answer stops, what it
streamed is saved with its origins, then the command runs; `/file PATH` sends the file's text."""

from __future__ import annotations

import pytest

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.engine import read_trace
from spectui.engine.worker import ModelInfo
from spectui.messages import ModelsLoaded, StepArrived, TurnFinished
from spectui.screens.dialogs import ConfirmScreen, ConversationsScreen
from spectui.screens.settings import SettingsScreen
from spectui.store import Store
from spectui.themes import DARK
from spectui.widgets.conversation import AnswerBlock, UserBlock
from spectui.widgets.token_tree import TokenTreeView

from tui_helpers import TRACE, wait_for

pytestmark = pytest.mark.anyio

SIZE = (140, 42)


def colour(key: str) -> str:
    return DARK.variables[f"origin-{key}"]


def piece_colours(text) -> list[tuple[str, str]]:
    """(piece, style) for each styled span of a rich Text."""
    return [(text.plain[span.start:span.end], str(span.style)) for span in text.spans]


async def test_origins_are_saved_and_a_reopened_chat_colours_them(fresh_home):
    info, events = read_trace(TRACE)
    app = ChatApp(model=info.model, autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await app.begin_answer(info.prompt, info.ssms, True, info.quant)  # as send() does, before the engine's turn
        for event in events:  # what the engine link posts: every step, the last one finished, then the turn's end
            app.post_message(StepArrived(event))
        reply = "".join(e.new_text for e in events)
        app.post_message(TurnFinished(reply, events[-1].stop_reason))
        await wait_for(pilot, lambda: not app.generating, 10, "the turn to end")
        record_id = app.record.id
    store = Store(paths.history_db())
    answer = store.messages(record_id)[-1]
    store.close()
    assert answer.role == "assistant" and answer.content == reply
    assert "".join(piece for piece, _ in answer.origins) == reply and answer.speculators == ["ngram"]
    assert {origin for _, origin in answer.origins} == {"ngram", "verifier"}

    again = ChatApp(autoload=False, overrides={"colour_origins": True})  # reopened, colours on (F4 saved)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        [block] = again.chat.query(AnswerBlock)
        assert block.has_class("-coloured") and block.pieces == answer.origins
        shown = block.query_one(".answer-coloured").render()
        assert shown.plain == reply  # drawn coloured at once, not blank until F4 is pressed twice
        spans = piece_colours(block.coloured())
        expected = [(piece, colour("ngram" if origin == "ngram" else "bonus")) for piece, origin in answer.origins]
        assert spans == expected


async def test_two_ssms_keep_their_numbers_when_the_chat_reopens(fresh_home):
    """Before (or without) the models that drafted it, SSM 2's tokens are still SSM 2's colour."""
    store = Store(paths.history_db())
    record = store.create("two SSMs")
    store.add_message(record.id, "user", "hi")
    pieces = [("Hello", "boost-2"), (" there", "boost-1+ngram"), ("!", "verifier")]
    store.add_message(record.id, "assistant", "Hello there!", pieces, ["boost-1", "boost-2", "ngram"])
    store.close()
    app = ChatApp(autoload=False, overrides={"colour_origins": True})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        [block] = app.chat.query(AnswerBlock)
        assert piece_colours(block.coloured()) == [("Hello", colour("ssm2")), (" there", colour("ssm1")), ("!", colour("bonus"))]


async def test_status_line_says_ssms_off_when_speculation_is_off(fresh_home):
    app = ChatApp(autoload=False, overrides={"speculate": False})
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(ModelsLoaded(ModelInfo("smollm2-135m", ["boost-1", "ngram"], "cpu", "nf4", "exact"), None))
        await pilot.pause()
        assert app.chat.status.ssms == "off"
        for expected in ("boost-1, ngram", "off"):
            await pilot.press("f3")
            assert isinstance(app.screen, SettingsScreen)
            app.screen.query_one("#speculate").toggle()
            await pilot.click("#save")
            await pilot.pause()
            assert app.chat.status.ssms == expected
            assert ("SSMs " + expected) in str(app.chat.status.render())


async def test_file_command_puts_the_document_in_the_message(fresh_home, tiny_model, tmp_path):
    """`/file PATH` on a line of its own: that line becomes the file's text (UTF-8, bad bytes as U+FFFD) in
    the message sent, shown and saved; the lines around it are sent as typed."""
    document = tmp_path / "report.txt"
    document.write_bytes("Revenue rose 4 % \u2014 a record.\n".encode() + b"\xff end\n")
    app = ChatApp(model=str(tiny_model), quant="none", device="cpu", seed=1,
                  overrides={"max_new_tokens": 4, "tree": "2,1"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.engine is not None or app.load_error, 120, "the model to load")
        assert app.load_error is None, app.load_error
        prompt = app.chat.query_one("#prompt")
        prompt.insert(f"Read this:\n/file {document}")
        await pilot.press("ctrl+j", *"Summarise it.", "enter")
        await wait_for(pilot, lambda: list(app.chat.query(UserBlock)) and not app.generating, 120, "the answer")
        expected = "Read this:\nRevenue rose 4 % \u2014 a record.\n\ufffd end\nSummarise it."
        assert [str(block.render()) for block in app.chat.query(UserBlock)] == [expected]
        assert prompt.text == "" and not app.chat.query_one("#notice").display
        messages, _ = saved(app.record.id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].content == expected
    assert messages[1].content


async def ask_and_pause(app, pilot, text: str) -> str:
    """Send `text` in step mode and let two steps through: the answer is streaming, paused."""
    tree = app.chat.query_one(TokenTreeView)
    await app.send(text)
    await wait_for(pilot, lambda: len(tree.events) >= 1, 60, "the first step")
    await pilot.press("f6")
    await wait_for(pilot, lambda: len(tree.events) >= 2, 60, "the second step")
    assert app.generating, "the answer ended before the test could interrupt it"
    return "".join(e.new_text for e in tree.events)


def saved(conversation_id: int):
    store = Store(paths.history_db())
    try:
        return store.messages(conversation_id), {r.id for r in store.list()}
    finally:
        store.close()


async def test_ctrl_n_f2_open_and_delete_act_while_an_answer_streams(fresh_home, tiny_model):
    app = ChatApp(model=str(tiny_model), quant="none", device="cpu", seed=1,
                  overrides={"max_new_tokens": 48, "tree": "2,1"}, step_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.engine is not None or app.load_error, 120, "the model to load")
        assert app.load_error is None, app.load_error
        # ctrl+n: the answer stops, is saved as far as it streamed, and a new conversation opens
        streamed = await ask_and_pause(app, pilot, "tell me about number 7")
        first = app.record.id
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: not app.generating and app.record.id != first, 30, "the new conversation")
        assert not list(app.chat.query(UserBlock)) and app.record.title == "New chat"
        messages, _ = saved(first)
        assert [(m.role, m.content) for m in messages][0] == ("user", "tell me about number 7")
        assert messages[1].role == "assistant" and messages[1].content.startswith(streamed)
        assert "".join(p for p, _ in messages[1].origins) == messages[1].content  # origins saved too
        # F2 → open another conversation: the same
        streamed = await ask_and_pause(app, pilot, "tell me about number 8")
        second = app.record.id
        await pilot.press("f2")
        assert isinstance(app.screen, ConversationsScreen)
        app.screen.query_one("#conversation-list").highlighted = [r.id for r in app.screen.records].index(first)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.generating and app.record.id == first, 30, "the first conversation")
        assert [str(b.render()) for b in app.chat.query(UserBlock)] == ["tell me about number 7"]
        messages, _ = saved(second)
        assert [m.role for m in messages] == ["user", "assistant"] and messages[1].content.startswith(streamed)
        # F2 → delete the conversation whose answer streams: asked first, then stopped, saved, deleted
        await ask_and_pause(app, pilot, "and number 9?")
        await pilot.press("f2")
        app.screen.query_one("#conversation-list").highlighted = [r.id for r in app.screen.records].index(first)
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen) and app.generating
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.generating and app.record.id != first, 30, "the deletion")
        _, conversations = saved(second)
        assert conversations == {second} and app.record.id == second
        assert app.is_running and app.link.state == "ready"
