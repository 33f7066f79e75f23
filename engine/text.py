"""IncrementalDecoder: turn a growing list of token ids into text deltas.

Decoding token by token breaks multi-byte characters and word-joining spaces, so the whole
answer is decoded each time and only the new suffix is emitted. A trailing U+FFFD (an
incomplete UTF-8 sequence) is held back until the next token completes it.
"""

from __future__ import annotations


class IncrementalDecoder:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.emitted = ""

    def push(self, tokens: list[int], final: bool = False) -> str:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=False)
        if not final and text.endswith("\ufffd"):
            return ""
        if not text.startswith(self.emitted):  # a merge rewrote earlier text: emit nothing twice
            self.emitted = text
            return ""
        delta, self.emitted = text[len(self.emitted) :], text
        return delta

    @property
    def text(self) -> str:
        return self.emitted
