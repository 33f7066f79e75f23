"""The model picker (ctrl+o): switch the model and its speculators inside the app.

Real engine processes on two tiny random LLaMA folders (the embedded model's tokenizer, different
seeds): a switch between two prompts keeps every message in the history and the second answer
comes from the new engine, which the status line and the config name; a switch while an answer
streams stops it and saves what streamed first. A folder that does not exist gets one line in the
picker and the engine keeps answering; a folder that fails to load leaves one notice line, and
another pick works. The picker's rows and buttons are reachable at 80x24 and 160x48 (no model)."""

from __future__ import annotations

import os

import pytest
from textual.widgets import Input, OptionList

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.config import load_config
from spectui.screens.models import ModelPickerScreen
from spectui.store import Store
from spectui.widgets.conversation import UserBlock
from spectui.widgets.token_tree import TokenTreeView
from tiny_models import save_tiny_llama

from tui_helpers import shown_on_screen, text_shown, wait_for

pytestmark = pytest.mark.anyio

SIZE = (140, 42)
FAST = dict(quant="none", device="cpu", seed=1)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory, embedded_dir):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-other") / "other", embedded_dir, seed=2)


def messages(conversation_id: int):
    store = Store(paths.history_db())
    try:
        return [(m.role, m.content) for m in store.messages(conversation_id)]
    finally:
        store.close()


async def loaded(app, pilot, model) -> None:
    """Until this model's engine is ready (after a switch the old one may still answer for a moment)."""
    await wait_for(pilot, lambda: (app.engine is not None and app.info.model == str(model)) or app.load_error, 180,
                   f"{model} to load")
    assert app.load_error is None, app.load_error
    assert app.info.model == str(model) and app.link.worker.info.model == str(model)
    assert app.chat.status.model.startswith(str(model))


async def ask(app, pilot, text: str) -> None:
    await pilot.press(*text, "enter")
    await wait_for(pilot, lambda: app.turn is None and not app.generating, 120, f"the answer to {text!r}")


async def pick(app, pilot, model, speculators: str | None = None) -> ModelPickerScreen:
    """ctrl+o, type the model in the field, highlight these speculators, enter."""
    await pilot.press("ctrl+o")
    picker = app.screen
    assert isinstance(picker, ModelPickerScreen)
    field = picker.query_one("#model-spec", Input)
    field.value = str(model)
    await pilot.pause()
    if speculators is not None:
        picker.query_one("#ssm-list", OptionList).highlighted = [c for c, _ in picker.choices].index(speculators)
    field.focus()
    await pilot.press("enter")
    await pilot.pause()
    return picker


async def test_switch_between_prompts_and_while_an_answer_streams(fresh_home, tiny_model, other_model):
    app = ChatApp(model=str(tiny_model), overrides={"max_new_tokens": 6, "tree": "2,1"}, **FAST)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot, tiny_model)
        assert app.info.speculators == ["ngram"]  # a folder's default: the n-gram drafter
        first_pid = app.info.pid
        await ask(app, pilot, "first question")
        await pick(app, pilot, other_model, "none")
        assert not isinstance(app.screen, ModelPickerScreen)
        await loaded(app, pilot, other_model)
        assert app.info.pid != first_pid and app.info.speculators == [] and app.chat.status.ssms == "-"
        await wait_for(pilot, lambda: not os.path.exists(f"/proc/{first_pid}"), 10, "the first engine process to exit")
        await ask(app, pilot, "second question")
        record = app.record.id
        history = messages(record)
        assert [role for role, _ in history] == ["user", "assistant", "user", "assistant"]
        assert history[0][1] == "first question" and history[2][1] == "second question"
        assert history[1][1] and history[3][1]
        assert [str(b.render()) for b in app.chat.query(UserBlock)] == ["first question", "second question"]
        config = load_config(paths.config_file())
        assert (config.model, config.speculators) == (str(other_model), "none")  # saved once it loaded

        # while an answer streams (step mode holds it): stopped, saved as far as it streamed, then switched
        app.action_toggle_step_mode()
        tree = app.chat.query_one(TokenTreeView)
        await app.send("third question")
        await wait_for(pilot, lambda: len(tree.events) >= 1, 60, "the first step")
        assert app.generating
        streamed = "".join(e.new_text for e in tree.events)
        second_pid = app.info.pid
        await pick(app, pilot, tiny_model, "ngram")
        await loaded(app, pilot, tiny_model)
        assert app.info.pid != second_pid and app.record.id == record
        history = messages(record)
        assert history[4] == ("user", "third question") and history[5][0] == "assistant"
        assert history[5][1].startswith(streamed)
        app.action_toggle_step_mode()
        await ask(app, pilot, "fourth question")
        assert [role for role, _ in messages(record)] == ["user", "assistant"] * 4
    again = ChatApp(autoload=False)  # the next start loads the model picked last
    assert (again.run_spec.model, again.run_spec.speculators) == (str(tiny_model), "ngram")
    assert (again.link.request.run.model, again.link.request.run.speculators) == (str(tiny_model), "ngram")


async def test_a_model_that_cannot_load_says_so_in_one_line(fresh_home, tiny_model, tmp_path):
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    app = ChatApp(model=str(tiny_model), overrides={"max_new_tokens": 4, "tree": "2,1"}, **FAST)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot, tiny_model)
        pid = app.info.pid
        # a folder that does not exist: one line in the picker, which stays open; the engine is untouched
        picker = await pick(app, pilot, tmp_path / "no-such-folder")
        assert app.screen is picker
        error = picker.query_one("#model-spec-error")
        text = str(error.render())
        assert error.display and "no such file or folder" in text and "\n" not in text and "Traceback" not in text
        await pilot.press("escape")
        assert app.link.state == "ready" and app.info.pid == pid
        await ask(app, pilot, "still there?")
        assert [role for role, _ in messages(app.record.id)] == ["user", "assistant"]
        # a folder that fails in the engine: one notice line, the conversation kept, another pick works
        await pick(app, pilot, broken)
        await wait_for(pilot, lambda: app.load_error, 180, "the load to fail")
        notice = str(app.chat.query_one("#notice").render())
        assert notice.startswith("Loading failed:") and "\n" not in notice and "ctrl+o" in notice
        assert "Traceback" not in notice and app.is_running
        assert app.chat.status.model == str(broken) and app.chat.status.state == "no model"
        assert load_config(paths.config_file()).model != str(broken)  # only a model that loaded is saved
        await pick(app, pilot, tiny_model)
        await loaded(app, pilot, tiny_model)
        await ask(app, pilot, "and now?")
        assert [role for role, _ in messages(app.record.id)] == ["user", "assistant"] * 2
        assert not app.chat.query_one("#notice").display


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_every_row_and_button_of_the_picker_is_reachable(fresh_home, tmp_path, size):
    models = paths.models_dir()
    (models / "hub" / "models--someorg--tiny-chat").mkdir(parents=True)  # cached models no preset covers
    (models / "gguf" / "mine-1-2").mkdir(parents=True)
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    app = ChatApp(model=str(folder), autoload=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("ctrl+o")
        picker = app.screen
        assert isinstance(picker, ModelPickerScreen)
        assert [row["spec"] for row in picker.rows] == [str(folder), "smollm2-135m", "llama-7b", "someorg/tiny-chat",
                                                        str(models / "gguf" / "mine-1-2")]
        body = picker.query_one("#model-picker")
        assert body.region.y >= 0 and body.region.bottom <= size[1]  # the dialog fits the window
        rows = picker.query_one("#model-list", OptionList)
        assert app.screen.focused is rows and rows.highlighted == 0
        for index, row in enumerate(picker.rows):  # down through the list: each row in turn is shown whole
            assert rows.highlighted == index
            assert row["label"] in text_shown(app, rows), f"row {index} not shown at {size}"
            assert picker.query_one("#model-spec", Input).value == picker.rows[index]["spec"]
            await pilot.press("down")
            await pilot.pause()
        await pilot.press("home")
        await pilot.pause()
        controls = ["model-list", "model-spec", "ssm-list", "switch", "cancel"]
        for name in controls:  # tab through the dialog: each control in turn is focused and visible
            focused = app.screen.focused
            assert focused.id == name and shown_on_screen(app, focused), f"{name} not visible at {size}"
            if name == "ssm-list":  # a folder's speculators: n-gram, none, then the SSMs shipped with spectui
                assert [c for c, _ in picker.choices][:2] == ["ngram", "none"] and len(picker.choices) >= 3
                for index, (_, label) in enumerate(picker.choices):
                    focused.highlighted = index
                    await pilot.pause()
                    assert label in text_shown(app, focused), f"speculator {index} not shown at {size}"
            await pilot.press("tab")
            await pilot.pause()
        app.screen.query_one("#cancel").focus()
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ModelPickerScreen) and app.link.state == "off"
