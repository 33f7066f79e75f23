"""Many prompts answered together by LeanModel: left-padded batched decoding (spectui tune's data).

`spectui tune` needs the verifier's own answers to thousands of prompts. transformers' batched
`generate` pays its per-layer machinery on every step (about 110 answer tokens/s here at batch 16);
LeanModel.run takes B sequences at once, so one step's kernel calls serve B tokens.

Layout, as transformers' generate lays out a left-padded batch (W = the longest prompt):

    cache      [B, S]   prompt b in columns W - len_b .. W - 1, then one column a step
    valid      [B, S]   False for padding, True for every real token so far
    positions           a prompt starts at position 0 whatever its padding; a step feeds len_b + t

Each prompt is prefilled alone (LeanModel.prefill_left_padded: a batched prefill would attend over
the padding, most of the time when one prompt is long) into its row of the batch cache. Each step feeds every sequence's newest token at position last + 1. A sequence that has emitted a
stop token is finished: its answer ends there (stop token included) and what it computes after is
thrown away. Greedy picks the argmax; sampling draws from engine/accept.py's target_probs
(temperature, then top-p), one multinomial draw per row.
"""

from __future__ import annotations

import torch

from .accept import target_probs


@torch.inference_mode()
def generate_batch(
    runner, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int], greedy: bool = True,
    temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None,
) -> list[tuple[list[int], bool]]:
    """Per prompt: (answer ids, up to and including its stop token; whether a stop token came).

    runner: a LeanModel (reset here, and left holding this batch)."""
    B, W = len(prompts), max(map(len, prompts))
    valid = torch.tensor([[False] * (W - len(p)) + [True] * len(p) for p in prompts])  # [B, W]
    logits = runner.prefill_left_padded(prompts)  # [B, V]: each prompt alone, into the batch's cache
    answers: list[list[int]] = [[] for _ in prompts]
    finished = [False] * B
    stops = set(stop_ids)
    last = torch.tensor([[len(p) - 1] for p in prompts])  # [B, 1]: each prompt's last position
    for step in range(max_new_tokens):
        if greedy:
            tokens = logits.argmax(-1)  # [B]
        else:
            tokens = torch.multinomial(target_probs(logits, temperature, top_p), 1, generator=generator)[:, 0]  # [B]
        for row, token in enumerate(tokens.tolist()):
            if not finished[row]:
                answers[row].append(token)
                finished[row] = token in stops
        if all(finished) or step == max_new_tokens - 1:
            break  # nothing left to feed
        valid = torch.cat([valid, torch.ones(B, 1, dtype=torch.bool)], dim=1)  # [B, S]
        last = last + 1
        logits = runner.run(tokens[:, None], last, valid[:, None, None, :], last_only=True)[:, -1]  # [B, V]
    return [(answer, done) for answer, done in zip(answers, finished)]
