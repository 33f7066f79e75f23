"""Batched decoding's sampler (engine/sample_rows.py) draws from target_probs' nucleus distribution.

Pearson's chi-square test over 40,000 draws (one row each, the same logits), p-value > 0.001, fixed
seeds: a sampler off by a renormalisation or by one token at the nucleus' edge fails it. The flat-row
path (a full sort of those rows alone) must give the very tokens the top-k prefix gives for the same
uniforms.
"""

from __future__ import annotations

import torch
from scipy.stats import chisquare

import spectui.engine.nucleus as nucleus
from spectui.engine.accept import target_probs
from spectui.engine.sample_rows import sample_rows

DRAWS = 40_000


def frequencies(tokens: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=V).double()


def test_draws_follow_the_nucleus_distribution():
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(1, 24, generator=g)
    for temperature, top_p in ((1.0, 1.0), (0.8, 0.95), (1.3, 0.6), (0.6, 0.8)):
        p = target_probs(logits, temperature, top_p)[0]  # [V]
        tokens = sample_rows(logits.expand(DRAWS, -1), temperature, top_p, torch.Generator().manual_seed(6))
        seen = frequencies(tokens, 24)
        assert seen[p == 0].sum() == 0, (temperature, top_p)  # never outside the nucleus
        kept = p > 0
        assert 3 <= int(kept.sum()) and (top_p == 1.0 or int(kept.sum()) < 24)  # a nucleus with an edge to test
        assert chisquare(seen[kept], DRAWS * p[kept]).pvalue > 1e-3, (temperature, top_p)


def test_a_wrong_edge_fails_the_test():
    """The check has teeth: the same draws scored against a nucleus one token wider fail it."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(1, 24, generator=g)
    tokens = sample_rows(logits.expand(DRAWS, -1), 1.3, 0.6, torch.Generator().manual_seed(6))
    p = target_probs(logits, 1.3, 0.6)[0]
    wider = torch.softmax(logits[0].double() / 1.3, -1)
    edge = int(wider.masked_fill(p > 0, -1.0).argmax())  # the likeliest token the nucleus drops
    wider = torch.where((p > 0) | (torch.arange(24) == edge), wider, 0.0)
    wider = wider / wider.sum()
    kept = wider > 0
    assert chisquare(frequencies(tokens, 24)[kept], DRAWS * wider[kept]).pvalue < 1e-3


def test_flat_rows_sorted_whole_give_the_prefix_tokens(monkeypatch):
    """Rows whose NUCLEUS_PREFIX likeliest tokens hold less than top_p are sorted whole; with a prefix
    too short for every row (all sorted whole) and one long enough for all, the same seed gives the same
    tokens, a batch mixing peaked and flat rows included."""
    g = torch.Generator().manual_seed(0)
    logits = torch.cat([torch.randn(8, 3000, generator=g) * scale for scale in (0.3, 3.0, 9.0)])  # [24, V]
    for top_p in (0.5, 0.95, 1.0):
        draws = []
        for prefix in (16, 3000):
            monkeypatch.setattr(nucleus, "NUCLEUS_PREFIX", prefix)
            draws.append(sample_rows(logits, 0.8, top_p, torch.Generator().manual_seed(3)))
        assert torch.equal(draws[0], draws[1]), top_p
        assert bool((target_probs(logits, 0.8, top_p).gather(1, draws[0][:, None]) > 0).all())
