"""Conversation: history, system prompt, chat template and the context budget.

`prompt_ids` renders the conversation with the tokenizer's chat template (or the preset's plain
one for base models), leaving room for `max_new_tokens` inside the context window. When the
history does not fit, the oldest turns are dropped (the system prompt and the newest user turn
stay) and a notice says so; when even that does not fit, ContextError explains.
`chat_turn` drives one assistant turn and always keeps what was generated, even when stopped.
A conversation that ends with the assistant's message is a continuation: that answer (cut at its
token limit) is rendered open, without its end of turn, and the turn's text is appended to it.
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

    @property
    def continues(self) -> bool:
        """The last message is the assistant's: the turn continues it (an answer cut at its token limit)."""
        return bool(self.messages) and self.messages[-1].role == "assistant"

    def take_reply(self, text: str) -> None:
        """Keep a turn's reply: the assistant's new message, or the continued answer's next part."""
        if self.continues:
            self.messages[-1].content += text
        else:
            self.add("assistant", text)

    def prompt_ids(self, tokenizer, context_window: int, max_new_tokens: int, chat_template: str | None = None):
        """-> (token ids, notice or None). The last message is the user's (a new answer follows) or the
        assistant's (rendered open, without its end of turn, so the answer goes on where it stopped)."""
        budget = context_window - max_new_tokens
        kept = list(self.messages)
        while True:
            ids = encode_chat(tokenizer, self.rendered(kept), chat_template, self.continues)
            if len(ids) <= budget:
                break
            if len(kept) <= 1 + self.continues:
                what = "the answer to continue and its question need" if self.continues else "the message needs"
                raise ContextError(
                    f"{what} {len(ids)} tokens but only {max(budget, 0)} fit the context window "
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


def encode_chat(tokenizer, messages: list[dict], chat_template: str | None = None, continue_final: bool = False) -> list[int]:
    """The template's rendering, ending with the assistant's header (a new answer) or, continue_final,
    inside the last (assistant) message, after its text."""
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=not continue_final, continue_final_message=continue_final,
        chat_template=chat_template, tokenize=True,
    )
    if hasattr(encoded, "keys"):  # a BatchEncoding
        encoded = encoded["input_ids"]
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return list(encoded)


def chat_turn(
    engine, models, conversation: Conversation, settings: GenerationSettings, stop: threading.Event | None = None
) -> Iterator[StepEvent]:
    """One assistant turn for the conversation's last user message, the reply appended to it as the
    assistant's; or, when the last message is the assistant's, that answer continued in place."""
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
        conversation.take_reply("".join(reply))
