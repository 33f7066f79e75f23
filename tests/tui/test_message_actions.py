"""A focused message's keys (message_actions.py): copy it or its code blocks; edit and resend, and
regenerate, each in a fork that leaves the original chat as it was; continue an answer cut at its
token limit (a real engine process on a tiny model). Also each message's time in its title, the
welcome line of an empty chat, and the refusals: one line each, no fork, nothing typed lost."""

from __future__ import annotations

import datetime as dt
import re
import time

import pytest

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.message_actions import fork_title
from spectui.replay import read_turns
from spectui.replay_app import ReplayApp
from spectui.store import Store
from spectui.widgets.conversation import AnswerBlock, UserBlock, code_blocks, stamp

from tui_helpers import TRACE, save_chat, wait_for

pytestmark = pytest.mark.anyio

SIZE = (120, 36)
ANSWER = "Two ways:\n\n```python\nprint('hi')\n```\n\nor in a shell\n\n~~~sh\necho hi\n~~~\n"
TIMED = re.compile(r"^(you|assistant) · \d\d:\d\d$")


def test_code_blocks_stamps_and_fork_titles():
    assert code_blocks(ANSWER) == ["print('hi')", "echo hi"]
    assert code_blocks("no code") == [] and code_blocks("```\nunclosed\nstill") == ["unclosed\nstill"]
    assert code_blocks("````md\n```\ninner\n```\n`````\nafter") == ["```\ninner\n```"]  # a longer fence closes
    noon = dt.datetime(2026, 11, 3, 12, 0).timestamp()
    assert stamp(noon, now=noon + 60) == "12:00"
    assert stamp(noon, now=noon + 3 * 86400) == "3 Nov 12:00"
    assert fork_title("Rivers", "edited") == "Rivers · edited"
    assert fork_title("Rivers · edited · regenerated", "edited") == "Rivers · edited"


def seed_history(*pairs: tuple[str, str]) -> int:
    """A saved conversation of (question, answer) pairs, titled by the first; -> its id."""
    return save_chat(pairs[0][0], *[(role, text) for pair in pairs for role, text in zip(("user", "assistant"), pair)])


def stored(conversation_id: int):
    """-> (a conversation's StoredMessages, every conversation), read from the file."""
    store = Store(paths.history_db())
    try:
        return store.messages(conversation_id), store.list()
    finally:
        store.close()


def saved(conversation_id: int):
    """-> ([(role, content)] of a conversation, every conversation)."""
    messages, conversations = stored(conversation_id)
    return [(m.role, m.content) for m in messages], conversations


def said(app) -> str:
    return " | ".join(str(n.message) for n in app._notifications)


async def test_copy_a_message_and_its_code_blocks_with_their_times(fresh_home):
    sent = stored(seed_history(("Print hi, two ways", ANSWER)))[0][0].created
    app = ChatApp(autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        assert not app.chat.query("#welcome")  # the chat has messages
        user, answer = list(app.chat.query(UserBlock)), list(app.chat.query(AnswerBlock))
        assert user[0].border_title == f"you · {time.strftime('%H:%M', time.localtime(sent))}"
        assert TIMED.match(answer[0].border_title)
        await pilot.press("alt+up")  # from the message box: the last message
        assert app.focused is answer[0]
        await pilot.press("c")
        assert app.clipboard == ANSWER
        await pilot.press("b")
        assert app.clipboard == "print('hi')"
        await pilot.press("b")
        assert app.clipboard == "echo hi"
        await pilot.press("b")
        assert app.clipboard == "print('hi')"  # in turn
        await pilot.press("alt+up")
        assert app.focused is user[0]
        await pilot.press("c")
        assert app.clipboard == "Print hi, two ways"
        await pilot.press("b")  # not an answer: nothing copied
        assert app.clipboard == "Print hi, two ways"
        await pilot.press("alt+up")  # the first message: stays
        assert app.focused is user[0]
        await pilot.press("escape")
        assert app.focused is app.chat.query_one("#prompt")
        await pilot.press("alt+up", "alt+down")
        assert app.focused is app.chat.query_one("#prompt")  # below the last message: the box again


async def test_a_selected_message_has_the_focus_within_the_key(fresh_home):
    """A key that arrives with alt+up (one read from the terminal) must reach the message: the focus
    moves inside the action, not on a later turn of the event loop."""
    seed_history(("Print hi, two ways", ANSWER))
    app = ChatApp(autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        app.chat.action_select_message(-1)
        assert app.focused is app.chat.query_one(AnswerBlock)
        app.chat.action_select_message(1)
        assert app.focused is app.chat.query_one("#prompt")


async def test_an_empty_chat_says_what_the_panel_shows_and_where_help_is(fresh_home):
    app = ChatApp(autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        welcome = str(app.chat.query_one("#welcome").render())
        assert "token tree" in welcome and "F1" in welcome
        await pilot.press("alt+up")  # no message to select
        assert app.focused is app.chat.query_one("#prompt")


async def test_refused_actions_say_why_and_leave_no_fork_and_no_lost_text(fresh_home):
    """No engine: r, n and a resent edit are refused before any copy is made; e keeps a draft;
    only the last answer can be regenerated or continued; Esc cancels an edit, keeping the text."""
    original = seed_history(("first question", "first answer"), ("second question", "second answer"))
    before, _ = saved(original)
    app = ChatApp(autoload=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        box = app.chat.query_one("#prompt")
        users, answers = list(app.chat.query(UserBlock)), list(app.chat.query(AnswerBlock))
        await pilot.press("alt+up", "alt+up", "alt+up")
        assert app.focused is answers[0]
        await pilot.press("r", "n")
        assert "only the last answer can be regenerated" in said(app)
        assert "only the last answer can be continued" in said(app)
        await pilot.press("alt+down", "alt+down")
        assert app.focused is answers[1]
        await pilot.press("r", "n")
        assert said(app).count("cannot answer yet: no model") == 2
        # a draft in the box is never replaced by an edit
        box.insert("a draft")
        await pilot.press("alt+up", "e")
        assert app.focused is users[1] and box.text == "a draft" and app.edit_target is None
        assert "holds text not sent yet" in said(app)
        box.clear()
        await pilot.press("e")
        assert box.text == "second question" and app.focused is box and app.edit_target is not None
        assert "Editing an earlier message" in str(app.chat.query_one("#notice").render())
        await pilot.press("alt+up", "alt+up", "alt+up", "alt+up", "e")  # another message; the first edit untouched
        assert box.text == "first question" and app.edit_target[1] == 0
        await pilot.press(*" again", "enter")  # no engine: nothing sent, nothing copied, the text stays
        assert box.text == "first question again" and app.edit_target is not None
        await pilot.press("escape")
        assert app.edit_target is None and box.text == "first question again"
        assert not app.chat.query_one("#notice").display
    messages, conversations = saved(original)
    assert messages == before and len(conversations) == 1


async def test_a_replay_is_copied_not_changed(fresh_home):
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        assert not app.chat.query("#welcome")  # no message box to ask in
        await app.play_to_end()
        await pilot.pause(0.2)
        answer = app.chat.query_one(AnswerBlock)
        assert answer.border_title == "assistant"  # a replay has no times
        await pilot.press("alt+up")
        assert app.focused is answer
        await pilot.press("c", "r")
        assert app.clipboard == answer.text and answer.text
        assert "a replay cannot be changed" in said(app)


async def test_continue_edit_and_regenerate_on_a_real_engine_keep_every_saved_message(fresh_home, tiny_model):
    app = ChatApp(model=str(tiny_model), quant="none", device="cpu", seed=1, overrides={"max_new_tokens": 6})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.engine is not None or app.load_error, 120, "the model to load")
        assert app.load_error is None, app.load_error
        box = app.chat.query_one("#prompt")
        for text in ("first question", "second question"):
            box.insert(text)
            await pilot.press("enter")
            await wait_for(pilot, lambda: not app.generating, 60, "the answer")
        assert all(TIMED.match(block.border_title) for block in app.chat.query(".message"))
        original = app.record.id
        before, _ = saved(original)
        assert [r for r, _ in before] == ["user", "assistant", "user", "assistant"]

        # continue: the answer stopped at its 6-token limit; n extends the same saved message
        last = list(app.chat.query(AnswerBlock))[-1]
        assert last.stop_reason == "length" and "n continues" in str(last.border_subtitle)
        ids = [m.id for m in stored(original)[0]]
        await pilot.press("alt+up", "n")
        await wait_for(pilot, lambda: not app.generating, 60, "the continuation")
        after, _ = saved(original)
        assert len(after) == 4 and after[3][1].startswith(before[3][1]) and len(after[3][1]) > len(before[3][1])
        assert after[:3] == before[:3] and last.text == after[3][1] and len(app.chat.query(AnswerBlock)) == 2
        extended = stored(original)[0]
        assert [m.id for m in extended] == ids  # extended in place, not a new message
        assert "".join(piece for piece, _ in extended[3].origins) == after[3][1]  # origins of both parts

        # edit and resend the first question: a fork with nothing before it, the original untouched
        await pilot.press("alt+up", "alt+up", "alt+up", "alt+up")
        assert app.focused is list(app.chat.query(UserBlock))[0]
        await pilot.press("e")
        assert box.text == "first question" and app.focused is box
        await pilot.press(*" again", "enter")
        await wait_for(pilot, lambda: not app.generating and app.record.id != original, 60, "the edited answer")
        fork = app.record.id
        edited, _ = saved(fork)
        assert [r for r, _ in edited] == ["user", "assistant"] and edited[0] == ("user", "first question again")
        assert app.record.title == "first question · edited" and saved(original)[0] == after

        # regenerate the last answer: a fork holding the question, answered again; the old answer stays
        await pilot.press("alt+up", "r")
        await wait_for(pilot, lambda: not app.generating and app.record.id != fork, 60, "the regenerated answer")
        regenerated, conversations = saved(app.record.id)
        assert [r for r, _ in regenerated] == ["user", "assistant"] and regenerated[0] == edited[0]
        assert app.record.title == "first question · regenerated"
        shown = list(app.chat.query(AnswerBlock))
        assert len(shown) == 1 and shown[0].text == regenerated[1][1]
        assert saved(fork)[0] == edited and saved(original)[0] == after and len(conversations) == 3
