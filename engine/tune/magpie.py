"""Magpie: user prompts synthesised by the verifier itself, then deduplicated and filtered.

An aligned chat model that is given only the pre-query template (everything a chat turn holds
before the user's words: system prompt, user header) writes a plausible user message and ends the
turn. Sampling that continuation many times gives a diverse prompt set in the model's own
distribution, with no dataset at all (Xu et al., 2024, "Magpie: Alignment Data Synthesis from
Scratch by Prompting Aligned LLMs with Nothing").

The pre-query ids come from the same `encode_chat` the engine uses: render one user message twice
with two different markers; the longest common prefix of the two token lists is exactly the
context before the user's first token, so SSMs later see the engine's format, token for token.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..chat import encode_chat

# Two user messages that differ from their first character on, and start like words (so a template's
# "USER: " keeps its space attached to the first word, as in real text).
MARKERS = ("Quokka7MagpieMarker", "Zebra3MagpieMarker")


def render(tokenizer, messages: list[dict], chat_template: str | None) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False, add_generation_prompt=False)


def pre_query_ids(tokenizer, chat_template: str | None) -> list[int]:
    """Token ids of the chat context before the user's words (system prompt + user header)."""
    a, b = (encode_chat(tokenizer, [{"role": "user", "content": m}], chat_template) for m in MARKERS)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def end_of_query(tokenizer, chat_template: str | None) -> str:
    """The text the template puts right after the user's words ('<|im_end|>', or a newline for plain ones)."""
    text = render(tokenizer, [{"role": "user", "content": MARKERS[1]}], chat_template)
    suffix = text.split(MARKERS[1], 1)[1]
    return suffix.strip() or suffix[:1] or "\n"


def template_fragments(tokenizer, chat_template: str | None) -> tuple[str, ...]:
    """Literal template text (role headers, default system prompt, special tokens): never part of a prompt."""
    messages = [{"role": "user", "content": MARKERS[1]}, {"role": "assistant", "content": MARKERS[1]}]
    text = render(tokenizer, messages, chat_template)
    lines = {line.strip() for piece in text.split(MARKERS[1]) for line in piece.splitlines()}
    lines = {line for line in lines if len(line) >= 3}  # a bare ':' would reject everything
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    specials |= {str(t) for t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values()}
    return tuple(sorted(s for s in lines | specials if s))


def normalise(text: str) -> str:
    """Case- and whitespace-insensitive key: 'What  is\\nAI?' and 'what is ai?' are one prompt."""
    return " ".join(text.casefold().split())


def read_excluded(path: Path | None) -> set[str]:
    """Normalised questions of a bench file (JSONL with 'turns', or one prompt a line)."""
    if path is None or not Path(path).exists():
        return set()
    out = set()
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            turns = json.loads(line).get("turns", []) if line.startswith("{") else [line]
        except ValueError:
            turns = [line]
        out |= {normalise(t) for t in turns if isinstance(t, str)}
    return out


@dataclass
class PromptFilter:
    """Keeps prompts of sane length, printable, free of template text, and not copied from the bench."""

    min_chars: int = 15
    max_chars: int = 400
    min_printable: float = 0.95
    forbidden: tuple[str, ...] = ()
    excluded: set[str] = field(default_factory=set)

    def reject_reason(self, text: str) -> str | None:
        """None when the prompt is kept, else a short reason (counted in the log)."""
        if not self.min_chars <= len(text) <= self.max_chars:
            return "length"
        if "\ufffd" in text:  # a broken UTF-8 sequence
            return "unprintable"
        printable = sum(ch.isprintable() or ch in "\n\t" for ch in text) / len(text)
        if printable < self.min_printable or unicodedata.category(text[0]).startswith("C"):
            return "unprintable"
        if any(fragment in text for fragment in self.forbidden):
            return "template"
        if normalise(text) in self.excluded:
            return "bench"
        return None


class Deduper:
    """Remembers normalised prompts; `add` is True only for a prompt not seen before."""

    def __init__(self, texts: list[str] = ()) -> None:
        self.seen = {normalise(t) for t in texts}

    def add(self, text: str) -> bool:
        key = normalise(text)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def clean(text: str, end_text: str) -> tuple[str, bool]:
    """Decoded sample -> (prompt text, whether the turn ended)."""
    ended = end_text in text
    text = text.split(end_text, 1)[0] if ended else text
    return re.sub(r"[ \t]+\n", "\n", text).strip(), ended


@dataclass
class SampleJudge:
    """One sampled continuation of the pre-query context -> the prompt it holds, or None with the reason
    counted in `rejected`: it did not end its turn (when `require_end`), the filter refused it, or it
    was seen before. `spectui tune` and scripts/feature_data.py --magpie keep prompts by the same rules."""

    tokenizer: object
    stop_ids: list[int]
    end_text: str
    filter: PromptFilter
    seen: Deduper
    require_end: bool = True
    rejected: dict[str, int] = field(default_factory=dict)

    @classmethod
    def for_template(cls, tokenizer, chat_template: str | None, stop_ids: list[int], cfg, seen: Deduper,
                     excluded: set[str]) -> "SampleJudge":
        """cfg: the TuneConfig whose prompt bounds and magpie_require_end apply; excluded: normalised
        prompts never to keep (read_excluded)."""
        flt = PromptFilter(cfg.min_prompt_chars, cfg.max_prompt_chars, cfg.min_printable,
                           template_fragments(tokenizer, chat_template), excluded)
        return cls(tokenizer, list(stop_ids), end_of_query(tokenizer, chat_template), flt, seen, cfg.magpie_require_end)

    def __call__(self, row: list[int]) -> str | None:
        stop = next((i for i, t in enumerate(row) if t in self.stop_ids), None)
        text, ended = clean(self.tokenizer.decode(row[:stop], skip_special_tokens=False), self.end_text)
        ended = ended or stop is not None
        reason = None if ended or not self.require_end else "unfinished"
        reason = reason or self.filter.reject_reason(text) or (None if self.seen.add(text) else "duplicate")
        if reason:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            return None
        return text


@torch.no_grad()
def synthesise(
    verifier,
    tokenizer,
    chat_template: str | None,
    stop_ids: list[int],
    wanted: int,
    cfg,
    seen: Deduper,
    keep: Callable[[str], None],
    rejected: dict[str, int] | None = None,
    tick: Callable[[int], None] | None = None,
    round_offset: int = 0,
) -> int:
    """Sample pre-query continuations until `wanted` new prompts were kept (each goes to `keep`).

    Gives up after ~10x the rounds that `wanted` should need (a model that rarely ends its turn),
    so the caller may get fewer. Returns the number kept.
    """
    head = pre_query_ids(tokenizer, chat_template)
    judge = SampleJudge.for_template(tokenizer, chat_template, stop_ids, cfg, seen, read_excluded(cfg.exclude_file))
    if rejected is not None:
        judge.rejected = rejected
    end_text = judge.end_text
    device = next(verifier.parameters()).device
    x = torch.tensor([head] * cfg.magpie_batch, device=device)  # [B, P]: same context, no padding
    kwargs = dict(
        do_sample=True, temperature=cfg.magpie_temperature, top_p=cfg.magpie_top_p, top_k=0,
        max_new_tokens=cfg.magpie_max_tokens, eos_token_id=stop_ids, pad_token_id=stop_ids[0],
    )
    end_ids = tokenizer.encode(end_text, add_special_tokens=False)
    if not (len(end_ids) == 1 and end_ids[0] in stop_ids):  # e.g. a newline ends the user turn
        kwargs.update(stop_strings=[end_text], tokenizer=tokenizer)
    kept, rounds, max_rounds = 0, 0, 10 * (wanted // cfg.magpie_batch + 1) + 10
    while kept < wanted and rounds < max_rounds:
        torch.manual_seed(cfg.seed * 1_000_003 + round_offset + rounds)
        rounds += 1
        out = verifier.generate(x, attention_mask=torch.ones_like(x), **kwargs)[:, len(head):]  # [B, <=N]
        for row in out.tolist():
            text = judge(row)
            if text is None:
                continue
            keep(text)
            kept += 1
            if tick:
                tick(1)
            if kept >= wanted:
                break
    return kept
