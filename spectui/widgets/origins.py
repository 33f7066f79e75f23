"""Token origins: which speculator a committed token came from, and its colour in the theme.

An origin is what StepEvent.token_origins holds: '+'-joined speculator names, or "verifier"
for the bonus token. Model SSMs are numbered in the order the engine lists them (SSM 1, SSM 2);
the prompt-lookup drafter is "ngram".
"""

from __future__ import annotations

from ..engine import BONUS_SOURCE, StepEvent

NGRAM = "ngram"


def origin_key(origin: str, ssm_names: list[str]) -> str:
    """-> one of 'bonus', 'ngram', 'ssm1', 'ssm2' (the theme variable suffix)."""
    if origin == BONUS_SOURCE:
        return "bonus"
    names = origin.split("+")
    models = [n for n in names if n != NGRAM]
    if not models:
        return "ngram"
    ssms = [n for n in ssm_names if n != NGRAM]
    index = ssms.index(models[0]) if models[0] in ssms else 0
    return "ssm1" if index == 0 else "ssm2"


def origin_label(key: str, short: bool = False) -> str:
    return {"bonus": "bonus" if short else "verifier bonus", "ngram": "n-gram", "ssm1": "SSM 1", "ssm2": "SSM 2"}[key]


def origin_colour(key: str, variables: dict[str, str]) -> str:
    fallback = {"bonus": "red", "ngram": "yellow", "ssm1": "cyan", "ssm2": "magenta"}[key]
    return variables.get(f"origin-{key}", fallback)


def token_pieces(event: StepEvent) -> list[tuple[str, str]]:
    """(text, origin) per committed token of a step, whose texts join to event.new_text."""
    by_id = {node.id: node for node in event.tree}
    texts = [by_id[i].text if i in by_id else "" for i in event.accepted]
    texts.append(event.bonus_text if event.bonus_token is not None else "")
    texts = texts[: len(event.token_origins)]
    if "".join(texts) != event.new_text:  # decoding merged bytes or cut a stop token: colour as one piece
        origin = event.token_origins[-1] if event.token_origins else BONUS_SOURCE
        return [(event.new_text, origin)] if event.new_text else []
    return [(t, o) for t, o in zip(texts, event.token_origins) if t]
