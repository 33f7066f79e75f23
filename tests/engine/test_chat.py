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
