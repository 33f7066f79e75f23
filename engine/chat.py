"""Conversation: history, system prompt, chat template and the context budget.

`prompt_ids` renders the conversation with the tokenizer's chat template (or the preset's plain
one for base models), leaving room for `max_new_tokens` inside the context window. When the
history does not fit, the oldest turns are dropped (the system prompt and the newest user turn
stay) and a notice says so; when even that does not fit, ContextError explains.
`chat_turn` drives one assistant turn and always keeps what was generated, even when stopped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator

from .events import StepEvent
from .settings import GenerationSettings


class ContextError(ValueError):
    """The newest message alone does not fit the context window."""


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass
class Conversation:
    system: str | None = None
    messages: list[Message] = field(default_factory=list)

    def add(self, role: str, content: str) -> None:
        self.messages.append(Message(role, content))

    def rendered(self, messages: list[Message]) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m.role, "content": m.content} for m in messages]

    def prompt_ids(self, tokenizer, context_window: int, max_new_tokens: int, chat_template: str | None = None):
        """-> (token ids, notice or None). The last message must be the user's."""
        budget = context_window - max_new_tokens
        kept = list(self.messages)
        while True:
            ids = encode_chat(tokenizer, self.rendered(kept), chat_template)
            if len(ids) <= budget:
                break
            if len(kept) <= 1:
                raise ContextError(
                    f"the message needs {len(ids)} tokens but only {max(budget, 0)} fit the context window "
                    f"({context_window} tokens, {max_new_tokens} kept for the answer)"
                )
            kept = kept[2:] if len(kept) > 2 and kept[0].role == "user" and kept[1].role == "assistant" else kept[1:]
        dropped = len(self.messages) - len(kept)
        notice = None
        if dropped:
            notice = (
                f"history truncated: the {dropped} oldest message(s) were left out to fit the "
                f"{context_window}-token context window"
            )
        return ids, notice


def encode_chat(tokenizer, messages: list[dict], chat_template: str | None = None) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, chat_template=chat_template, tokenize=True
    )
    if hasattr(encoded, "keys"):  # a BatchEncoding
        encoded = encoded["input_ids"]
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return list(encoded)


def chat_turn(
    engine, models, conversation: Conversation, settings: GenerationSettings, stop: threading.Event | None = None
) -> Iterator[StepEvent]:
    """One assistant turn for the conversation's last user message; the reply is appended to it."""
    ids, notice = conversation.prompt_ids(
        models.tokenizer, models.context_window, settings.max_new_tokens, models.chat_template
    )
    reply = []
    try:
        for event in engine.generate(ids, settings, stop, reuse=True):  # a turn prefills only what is new
            if event.step == 0:
                event.notice = notice
            reply.append(event.new_text)
            yield event
    finally:
        conversation.add("assistant", "".join(reply))
