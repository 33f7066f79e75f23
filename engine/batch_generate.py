"""Many prompts answered together by LeanModel: left-padded batched decoding (spectui tune's data).

`spectui tune` needs the verifier's own answers to thousands of prompts. transformers' batched
`generate` pays its per-layer machinery on every step (about 110 answer tokens/s here at batch 16);
LeanModel.run takes B sequences at once, so one step's kernel calls serve B tokens.

Layout, as transformers' generate lays out a left-padded batch (W = the longest prompt):

    cache      [B, S]   prompt b in columns W - len_b .. W - 1, then one column a step
    valid      [B, S]   False for padding, True for every real token so far
    positions           a prompt starts at position 0 whatever its padding; a step feeds len_b + t

Each prompt is prefilled alone (LeanModel.prefill_left_padded: a batched prefill would attend over
the padding, most of the time when one prompt is long) into its row of the batch cache. Each step
feeds every sequence's newest token at position last + 1. A sequence that has emitted a stop token
is finished: its answer ends there (stop token included). Greedy picks the argmax; sampling draws
one token a row from the nucleus distribution (temperature, then top-p: engine/sample_rows.py).

Two things keep a step from paying for rows that do no work:

  * groups by length (plan_groups): every row of a group attends over the group's longest prompt,
    padding included, so one 600-token prompt among fifteen 40-token ones makes the whole batch
    attend over 600 columns. A step costs about FIXED + n ROW + n S key reads (n rows over S
    columns; measured here, NF4 verifier, 2 threads: 10 ms + 0.75 ms a row + 5 us a row per
    column). The batch is sorted by length and cut where the sum of the groups' costs is least,
    and each group is decoded on its own.
  * finished rows leave: once a quarter of a group's rows are finished, the cache keeps only the
    others (LeanModel.keep_rows).

Feature data as it goes (`on_rows`, for a feature drafter's training: engine/tune/features.py).
The verifier's final hidden state and top-k next tokens at every position of prompt + answer are
what a teacher-forced pass over the finished sequence would compute (the hidden states and the
tokens bit for bit: rows are independent, below; their log-probabilities to float32 rounding, as the
output layer's product may round differently for one row and for many), and decoding computes them
already: the prefill for the prompt's rows, each step for the token it feeds. So they are kept as
decoding goes, with no second pass. The last answer token is never fed (nothing follows it), so a
sequence's rows are prompt + answer[:-1].

Neither changes an answer: LeanModel's rows are independent of one another (the exact attention and
the 4-bit kernel compute each row alone; the output layer's argmax is exact, kernels/guarded_head.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .sample_rows import sample_rows


@dataclass(frozen=True)
class StepCost:
    """A batched step's cost in units of one key read by one row (about 5 us here)."""

    fixed: float = 2000.0  # the weights' kernel calls, whatever the rows (10 ms)
    row: float = 150.0  # per row: its share of the matmuls, norms and sampling (0.75 ms)

    def group(self, rows: int, longest: int, new_tokens: int) -> float:
        """A group's decode: new_tokens steps over on average longest + new_tokens / 2 columns."""
        return new_tokens * (self.fixed + rows * (self.row + longest + new_tokens / 2))


def plan_groups(lengths: list[int], new_tokens: int, cost: StepCost = StepCost()) -> list[list[int]]:
    """Split prompts (their lengths) into groups of consecutive lengths at the least total cost.

    Dynamic programme over the prompts sorted by length: best[j] = min over i < j of
    best[i] + cost(prompts i..j-1 as a group), whose longest is the (j-1)-th. -> lists of indices."""
    order = sorted(range(len(lengths)), key=lambda b: lengths[b])
    best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            total = best[i] + cost.group(j - i, lengths[order[j - 1]], new_tokens)
            if total < best[j]:
                best[j], cut[j] = total, i
    groups, j = [], len(order)
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


@torch.inference_mode()
def generate_batch(
    runner, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int], greedy: bool = True,
    temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None,
    groups: list[list[int]] | None = None, on_rows: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> list[tuple[list[int], bool]]:
    """Per prompt: (answer ids, up to and including its stop token; whether a stop token came).

    runner: a LeanModel (reset here, and left holding the last group); groups: lists of prompt
    indices decoded together (default plan_groups); on_rows(b, logits [n, V], hidden [n, H]): the
    verifier's rows for prompt b as they are computed, its prompt's first, then one a step for the
    token fed (after its stop token a row may go on being fed: rows past prompt + answer[:-1] are
    not the answer's)."""
    results: list[tuple[list[int], bool]] = [([], False)] * len(prompts)
    for group in groups or plan_groups([len(p) for p in prompts], max_new_tokens):
        rows = None if on_rows is None else (lambda r, logits, hidden, group=group: on_rows(group[r], logits, hidden))
        answers = decode_group(runner, [prompts[b] for b in group], max_new_tokens, set(stop_ids),
                               greedy, temperature, top_p, generator, rows)
        for b, answer in zip(group, answers):
            results[b] = answer
    return results


def decode_group(runner, prompts, max_new_tokens, stops, greedy, temperature, top_p, generator, on_rows=None):
    B, W = len(prompts), max(map(len, prompts))
    valid = torch.tensor([[False] * (W - len(p)) + [True] * len(p) for p in prompts])  # [B, W]
    runner.keep_hidden = on_rows is not None
    logits = runner.prefill_left_padded(prompts, on_rows)  # [B, V]: each prompt alone, into the batch's cache
    answers: list[list[int]] = [[] for _ in prompts]
    finished = [False] * B
    live = list(range(B))  # the prompts the cache's rows hold, in order
    last = torch.tensor([[len(p) - 1] for p in prompts])  # [B, 1]: each row's last position
    for step in range(max_new_tokens):
        if greedy:
            tokens = logits.argmax(-1)  # [rows]
        else:
            tokens = sample_rows(logits, temperature, top_p, generator)  # [rows]
        for b, token in zip(live, tokens.tolist()):
            if not finished[b]:
                answers[b].append(token)
                finished[b] = token in stops
        if all(finished) or step == max_new_tokens - 1:
            break  # nothing left to feed
        done = [r for r, b in enumerate(live) if finished[b]]
        if done and 4 * len(done) >= len(live):  # drop the finished rows from the cache
            keep = [r for r, b in enumerate(live) if not finished[b]]
            runner.keep_rows(keep)
            live, tokens, valid, last = [live[r] for r in keep], tokens[keep], valid[keep], last[keep]
        valid = torch.cat([valid, torch.ones(len(live), 1, dtype=torch.bool)], dim=1)  # [rows, S]
        last = last + 1
        logits = runner.run(tokens[:, None], last, valid[:, None, None, :], last_only=True)[:, -1]  # [rows, V]
        if on_rows is not None:  # the rows of the tokens just fed
            for r, b in enumerate(live):
                on_rows(b, logits[r : r + 1], runner.hidden[r])  # [1, V], [1, H]
    runner.keep_hidden = False
    return [(answer, done) for answer, done in zip(answers, finished)]
