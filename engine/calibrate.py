"""Measure the cost model at load (costs.py): the engine's own verification step on a synthetic prefix.

For each T in costs.GRID a chain tree of T nodes is scored, accepted and cropped away again,
REPEATS times after one untimed pass, over a prefix of PREFIX_LEN tokens; c_verify(T) is the
fastest of them (noise only ever adds time), made non-decreasing in T. Each SSM is timed drafting two levels over the same prefix. About a second on the
project's 2-core CPU for the 135M verifier; `prepare_costs` caches the result per CostKey.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .accept import accept_greedy
from .costs import GRID, CostKey, CostModel, cache_path
from .tree import TokenTree

PREFIX_LEN = 160  # tokens: a short chat turn
REPEATS = 2  # with the untimed pass, 3 forwards per size: the warm-up stays under 2 s
NOISY_SPREAD = 1.5  # slowest / fastest pass of one size above this: the machine was busy (reported)


def synthetic_prefix(engine, length: int = PREFIX_LEN) -> list[int]:
    """Ordinary text tokens (a repeated sentence), so attention and caches see a realistic prefix."""
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog near the river bank. ")
    ids = [i for i in ids if i not in engine.stop_token_ids] or [1]
    return (ids * (length // len(ids) + 1))[:length]


def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


@torch.inference_mode()
def measure_costs(engine, grid=GRID, repeats: int = REPEATS, prefix: list[int] | None = None) -> CostModel:
    """c_verify(T) for T in `grid` (and each model drafter's cost) over `prefix` (default: the synthetic
    one); the largest T must not exceed len(prefix)."""
    began = time.perf_counter()
    prefix = prefix or synthetic_prefix(engine)
    verifier = engine.verifier
    verifier.argmax_only = True  # as greedy decoding without display runs it (LeanModel.output)
    verifier.reset()
    engine.cached_ids = []
    verifier.forward_chain(prefix[:-1], last_only=True)
    base = verifier.length

    def verify(size: int) -> None:
        tree = TokenTree.with_root(prefix[-1])
        tree.add_path(prefix[: size - 1], 0)
        logits = engine.score_tree(tree)
        accept_greedy(tree, logits)
        verifier.crop(base)

    table, floor, spread = {}, 0.0, 1.0
    for size in grid:
        verify(size)  # untimed: first calls of a shape allocate
        times = [time_ms(lambda: verify(size)) for _ in range(repeats)]
        floor = table[size] = max(floor, min(times))
        spread = max(spread, max(times) / min(times))
    verifier.reset()
    model = CostModel(table, prefix_len=len(prefix), noisy=spread > NOISY_SPREAD)
    for drafter in engine.drafters:
        if drafter.kind == "model":
            model.draft_ms[drafter.name] = measure_drafter(drafter, prefix)
    model.measured_s = time.perf_counter() - began
    return model


def measure_drafter(drafter, prefix: list[int]) -> float:
    """ms per SSM forward while drafting (catch-up + 2 levels), the fastest of REPEATS runs."""
    drafter.reset()

    def draft() -> None:  # a typical step: catch up one committed token, then draft two levels
        drafter.rewind(prefix)  # the cache keeps all but the prefix's last token
        tree = TokenTree.with_root(prefix[-1])
        frontier = drafter.begin(prefix, tree, 0, 3)
        drafter.expand(tree, 0, frontier[:2], 2)
        drafter.finish()

    draft()
    cost = min(time_ms(draft) / 2 for _ in range(REPEATS))
    drafter.reset()
    return cost


def prepare_costs(engine, cache_dir: Path | None, key: CostKey) -> CostModel:
    """The cost model for `key`: read from `cache_dir` when measured before, else measured (and saved)."""
    path = cache_path(cache_dir, key) if cache_dir is not None else None
    model = CostModel.load(path, key) if path is not None else None
    if model is None:
        model = measure_costs(engine)
        if path is not None:  # even a noisy table: real steps replace it within a few (costs.py)
            try:
                model.save(path, key)
            except OSError:
                pass  # an unwritable cache costs a re-measurement next start, nothing else
    engine.cost_model = model
    return model
