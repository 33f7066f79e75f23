"""Conversation: chat template, system prompt, and the context budget with its notice."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from spectui.engine.chat import ContextError, Conversation


@pytest.fixture(scope="module")
def tokenizer(embedded_dir):
    return AutoTokenizer.from_pretrained(embedded_dir)


def test_template_renders_system_and_turns(tokenizer):
    c = Conversation(system="You are terse.")
    c.add("user", "Hi")
    c.add("assistant", "Hello.")
    c.add("user", "Capital of France?")
    ids, notice = c.prompt_ids(tokenizer, 8192, 64)
    text = tokenizer.decode(ids)
    assert notice is None
    assert text.index("You are terse.") < text.index("Hi") < text.index("Hello.") < text.index("Capital of France?")
    assert text.rstrip().endswith("<|im_start|>assistant")


def test_history_truncated_to_fit_with_notice(tokenizer):
    c = Conversation(system="Sys.")
    for k in range(10):
        c.add("user", f"question {k} " + "word " * 30)
        c.add("assistant", f"answer {k} " + "word " * 30)
    c.add("user", "last question")
    ids, notice = c.prompt_ids(tokenizer, context_window=300, max_new_tokens=100)
    assert len(ids) <= 200
    text = tokenizer.decode(ids)
    assert "last question" in text and "Sys." in text and "question 0" not in text
    assert notice and "truncated" in notice and "300-token" in notice
    assert len(c.messages) == 21  # the stored history itself is never cut


def test_message_too_long_for_context_is_a_clear_error(tokenizer):
    c = Conversation()
    c.add("user", "word " * 500)
    with pytest.raises(ContextError, match="context window"):
        c.prompt_ids(tokenizer, context_window=256, max_new_tokens=64)


def test_an_answer_cut_at_its_token_limit_continues_in_place(tokenizer):
    c = Conversation()
    c.add("user", "Capital of France?")
    c.add("assistant", "The capital of France is")
    assert c.continues
    text = tokenizer.decode(c.prompt_ids(tokenizer, 8192, 64)[0])
    assert text.endswith("<|im_start|>assistant\nThe capital of France is")  # open: no end of turn after it
    c.add("user", "And of Spain?")
    assert not c.continues


def test_a_base_models_plain_template_continues_too(tokenizer):
    from spectui.engine.presets import PLAIN_CHAT_TEMPLATE

    c = Conversation()
    c.add("user", "Capital of France?")
    c.add("assistant", "The capital of France is")
    text = tokenizer.decode(c.prompt_ids(tokenizer, 8192, 64, PLAIN_CHAT_TEMPLATE)[0])
    assert text.endswith("USER: Capital of France?\nASSISTANT: The capital of France is")


def test_a_continuation_keeps_its_question_when_history_is_cut(tokenizer):
    c = Conversation()
    for k in range(6):
        c.add("user", f"question {k} " + "word " * 30)
        c.add("assistant", f"answer {k} " + "word " * 30)
    ids, notice = c.prompt_ids(tokenizer, context_window=300, max_new_tokens=100)
    text = tokenizer.decode(ids)
    assert "question 5" in text and text.endswith("answer 5 " + "word " * 30) and "question 0" not in text
    assert notice and "truncated" in notice
    with pytest.raises(ContextError, match="the answer to continue and its question need"):
        c.prompt_ids(tokenizer, context_window=100, max_new_tokens=64)


def test_a_turns_reply_is_a_new_answer_or_the_continued_ones_next_part():
    c = Conversation()
    c.add("user", "Hi")
    c.take_reply("Hel")
    c.take_reply("lo.")
    assert [(m.role, m.content) for m in c.messages] == [("user", "Hi"), ("assistant", "Hello.")]


def test_continuing_greedily_gives_the_longer_answer(embedded_models):
    """8 tokens, then 8 more continuing the saved text: the 16-token answer, and one message."""
    from spectui.engine import GenerationSettings
    from spectui.engine.chat import chat_turn
    from spectui.engine.loading import build_engine

    engine = build_engine(embedded_models)
    whole, parts = Conversation(), Conversation()
    for c in (whole, parts):
        c.add("user", "Name three rivers of Europe.")
    events = list(chat_turn(engine, embedded_models, whole, GenerationSettings(max_new_tokens=16, speculate=False)))
    assert events[-1].stop_reason == "length"
    for _ in range(2):
        events = list(chat_turn(engine, embedded_models, parts, GenerationSettings(max_new_tokens=8, speculate=False)))
        assert events[-1].stop_reason == "length"
    assert [m.role for m in parts.messages] == ["user", "assistant"]
    assert parts.messages[-1].content == whole.messages[-1].content
