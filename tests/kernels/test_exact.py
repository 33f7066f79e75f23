"""The CPU verifier's exact path: layout-invariant attention and the argmax-exact output layer.

Together they make a token's greedy choice in a tree pass the very one a one-token decode makes,
which is what lets the verifier use bitsandbytes' fused bf16 4-bit kernel losslessly.
"""

from __future__ import annotations

import pytest
import torch

from spectui.kernels.exact_attention import exact_attention
from spectui.kernels.guarded_head import GuardedHead
from spectui.kernels.reference import dense_tree_mask, tree_attention_reference

from test_tree_attention import ancestor_mask, make_inputs

TREES = [
    [-1],
    [-1, 0, 0, 1, 3, 2],
    [-1, 0, 1, 2, 3, 4, 5, 6],  # a chain
    [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 7, 3],
]


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("Hq, Hkv, D, P", [(4, 4, 64, 0), (6, 2, 64, 33), (9, 3, 64, 190), (8, 1, 32, 5)])
def test_matches_the_reference_in_float64(parents, Hq, Hkv, D, P):
    q, k, v, m = make_inputs(7, 1, Hq, Hkv, len(parents), D, P, torch.float64, [parents])
    got = exact_attention(q, k, v, dense_tree_mask(m, P))
    torch.testing.assert_close(got, tree_attention_reference(q, k, v, m, P), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("T, S", [(1, 1), (1, 40), (5, 5), (7, 30)])
def test_no_mask_is_causal_over_the_last_positions(T, S):
    g = torch.Generator().manual_seed(T * 100 + S)
    q = torch.randn(1, 6, T, 64, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, S, 64, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, S, 64, generator=g, dtype=torch.float64)
    causal = torch.ones(T, S, dtype=torch.bool).tril(S - T)[None, None]  # query i sees keys <= S - T + i
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=causal)
    torch.testing.assert_close(exact_attention(q, k, v, None), want, atol=1e-12, rtol=1e-12)
    additive = torch.zeros(1, 1, T, S, dtype=torch.float64).masked_fill(~causal, float("-inf"))
    torch.testing.assert_close(exact_attention(q, k, v, additive), want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("parents", TREES[1:])
@pytest.mark.parametrize("seed", range(3))
def test_a_node_gets_the_same_bits_as_a_one_token_decode(parents, seed):
    """Node i of a tree pass vs the same query decoded alone over [prefix, its ancestors, itself]
    laid out contiguously (what the cache holds once those tokens are accepted): bitwise equal."""
    P, T = 57, len(parents)
    q, k, v, m = make_inputs(seed, 1, 9, 3, T, 64, P, torch.float32, [parents])
    tree = exact_attention(q, k, v, dense_tree_mask(m, P))  # [1, 9, T, 64]
    for i in range(T):
        path = [P + j for j in range(T) if m[0, i, j]]  # ancestors, in tree order = depth order
        keep = torch.tensor(list(range(P)) + path)
        alone = exact_attention(q[:, :, i:i + 1], k[:, :, keep], v[:, :, keep], None)
        assert torch.equal(tree[:, :, i:i + 1], alone), f"node {i}"
    # SDPA does not have this property: the same comparison differs in the last bits somewhere
    sdpa_tree = tree_attention_reference(q, k, v, m, P)
    differs = False
    for i in range(T):
        keep = torch.tensor(list(range(P)) + [P + j for j in range(T) if m[0, i, j]])
        alone = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, i:i + 1], k[:, :, keep].repeat_interleave(3, 1), v[:, :, keep].repeat_interleave(3, 1))
        differs |= not torch.equal(sdpa_tree[:, :, i:i + 1], alone)
    assert differs or T < 8  # (kept as a witness of why exact attention exists; small trees may agree)


def head_with_near_ties(seed: int, V: int = 4096, D: int = 576, M: int = 24):
    """A random head and hidden rows where half the rows have a planted near-tie at the top."""
    g = torch.Generator().manual_seed(seed)
    W = torch.nn.Parameter(torch.randn(V, D, generator=g) * 0.05, requires_grad=False)
    X = torch.randn(M, D, generator=g) * 2
    with torch.no_grad():
        for r in range(0, M, 2):  # make tokens a and b score within ~1e-6 of each other for row r
            a, b = (r * 37) % V, (r * 37 + 1) % V
            W[b] = W[a] + 1e-7 * torch.randn(D, generator=g)
            X[r] += 20 * W[a] / W[a].norm()  # and lift them to the top
    return GuardedHead(W), X


@pytest.mark.parametrize("seed", range(4))
def test_head_argmax_is_the_one_token_argmax(seed):
    head, X = head_with_near_ties(seed)
    with torch.no_grad():
        fast = head(X[None])[0]  # [M, V]
        canonical = torch.stack([head(X[r][None, None])[0, 0] for r in range(X.shape[0])])
    assert torch.equal(fast.argmax(-1), canonical.argmax(-1))
    assert head.recomputed > 0  # the planted ties were caught and recomputed ...
    assert head.recomputed <= X.shape[0] // 2  # ... and only those
    torch.testing.assert_close(fast, canonical, atol=1e-4, rtol=0)


def test_head_one_row_is_the_canonical_product():
    head, X = head_with_near_ties(9, M=3)
    with torch.no_grad():
        got = head(X[1][None, None])[0, 0]
        pair = torch.stack([X[1], X[1]])
        assert torch.equal(got, (head.weight @ pair.T)[:, 0])
        assert torch.equal(head(X[1][None])[0], got)  # [1, D] input: same path


def test_a_row_that_may_see_nothing_gives_zeros():
    """Left padding in a batch: a pad position's row is fully masked (SDPA's convention: zeros)."""
    q, k, v, _ = make_inputs(3, 2, 4, 2, 5, 64, 0, torch.float32, [[-1, 0, 1, 2, 3]] * 2)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, :, :, :2] = False  # batch item 1: two pad positions at the start
    out = exact_attention(q, k, v, mask)
    assert torch.equal(out[1, :, :2], torch.zeros_like(out[1, :, :2]))  # pad rows see nothing
    assert torch.isfinite(out).all() and out[1, :, 2:].abs().sum() > 0


def test_a_long_causal_prefill_is_chunked_without_changing_a_bit():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 6, 300, 64, generator=g)
    k = torch.randn(1, 2, 310, 64, generator=g)
    v = torch.randn(1, 2, 310, 64, generator=g)
    whole = exact_attention(q, k, v, None)  # chunks of 128 queries
    causal = torch.ones(300, 310, dtype=torch.bool).tril(10)[None, None]
    assert torch.equal(whole, exact_attention(q, k, v, causal))  # one block, explicit mask
    assert torch.equal(whole[:, :, 200:201], exact_attention(q[:, :, 200:201], k[:, :, :211], v[:, :, :211], None))
