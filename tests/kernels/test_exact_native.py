"""The exact attention's C kernels (kernels/exact_attention.c) against its torch float64 path and each other.

The kernels (float32, a fixed order) must give the torch path's results to float32's accuracy, a tree
row the bits of a one-token pass over the keys it sees, and zeros for a row that may see nothing. The
grouped kernel must give every row the per-row kernel's bits, whatever the mask, batch, head
dimension, grouping, block or thread count. The other tests of the exact attention (test_exact.py)
run on whichever path this machine takes.
"""

from __future__ import annotations

import pytest
import torch

from spectui.kernels import exact_attention as ea
from spectui.kernels import native
from spectui.kernels.reference import ancestor_mask

pytestmark = pytest.mark.skipif(not native.cpu_supported() or native.compiler() is None,
                                reason="the kernel needs x86-64 with AVX2/FMA and a C compiler")


def torch_path(monkeypatch, *args):
    monkeypatch.setitem(native._LOADED, "exact_attention", (None, "off for this comparison"))
    try:
        return ea.exact_attention(*args)
    finally:
        monkeypatch.delitem(native._LOADED, "exact_attention")


def tree_mask(T: int, S: int, seed: int) -> torch.Tensor:
    """bool [1, 1, T, S]: the prefix for all, then each node its ancestors (random parents) and itself."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)]
    mask = torch.zeros(1, 1, T, S, dtype=torch.bool)
    mask[..., : S - T] = True
    for i in range(T):
        j = i
        while j >= 0:
            mask[0, 0, i, S - T + j] = True
            j = parents[j]
    return mask


@pytest.mark.parametrize("Hq, Hkv, D, T, S", [(9, 3, 64, 1, 200), (9, 3, 64, 8, 120), (4, 4, 32, 5, 5),
                                              (8, 1, 64, 130, 140), (4, 2, 40, 3, 900)])
@pytest.mark.parametrize("masked", [False, True])
def test_the_kernel_gives_the_torch_paths_results(monkeypatch, Hq, Hkv, D, T, S, masked):
    torch.manual_seed(T + S)
    q, k, v = torch.randn(1, Hq, T, D) * 2, torch.randn(1, Hkv, S, D), torch.randn(1, Hkv, S, D)
    mask = tree_mask(T, S, seed=S) if masked else None
    got = ea.native_attention(q, k, v, mask, D**-0.5)
    assert got is not None
    expected = torch_path(monkeypatch, q, k, v, mask)  # float64, rounded once
    assert torch.allclose(got, expected, rtol=1e-5, atol=2e-6)
    assert not torch.equal(got, expected) or T * S < 100  # float32 sums: not the float64 path's bits


@pytest.mark.parametrize("seed", range(3))
def test_a_tree_row_has_the_bits_of_a_one_token_pass_over_the_keys_it_sees(seed):
    torch.manual_seed(seed)
    T, S, D = 9, 150, 64
    q, k, v = torch.randn(1, 9, T, D), torch.randn(1, 3, S, D), torch.randn(1, 3, S, D)
    mask = tree_mask(T, S, seed)
    tree = ea.native_attention(q, k, v, mask, D**-0.5)
    for t in range(T):
        seen = mask[0, 0, t].nonzero().flatten()
        alone = ea.native_attention(q[:, :, t:t + 1], k[:, :, seen], v[:, :, seen], None, D**-0.5)
        assert torch.equal(alone[:, :, 0], tree[:, :, t])


def test_a_strided_cache_gives_a_contiguous_ones_bits():
    torch.manual_seed(1)
    q = torch.randn(1, 9, 3, 64)
    cache = torch.randn(2, 1, 3, 256, 64)  # [2, B, Hkv, capacity, D]: a preallocated cache, 100 positions used
    k, v = cache[0, :, :, :100], cache[1, :, :, :100]
    mask = tree_mask(3, 100, seed=1)
    assert torch.equal(ea.native_attention(q, k, v, mask, 0.125),
                       ea.native_attention(q, k.contiguous(), v.contiguous(), mask, 0.125))


def test_what_the_kernel_does_not_take_goes_to_torch():
    q, k, v = torch.randn(1, 4, 2, 64), torch.randn(1, 4, 10, 64), torch.randn(1, 4, 10, 64)
    additive = torch.zeros(1, 1, 2, 10)
    assert ea.native_attention(q, k, v, additive, 0.125) is None  # an additive mask
    assert ea.native_attention(q.double(), k.double(), v.double(), None, 0.125) is None  # not a float32 query
    assert ea.native_attention(q, k, v.double(), None, 0.125) is None  # keys and values unlike
    assert ea.native_attention(q, k.double(), v.double(), None, 0.125) is None  # a float64 cache: the torch path's
    q12, k12 = torch.randn(1, 4, 2, 12), torch.randn(1, 4, 10, 12)
    assert ea.native_attention(q12, k12, k12.clone(), None, 0.125) is None  # D not a multiple of 8
    per_head = torch.ones(1, 4, 2, 10, dtype=torch.bool)
    assert ea.native_attention(q, k, v, per_head, 0.125) is None  # a mask per head
    out = ea.exact_attention(q, k, v, additive, 0.125)  # still answered, by the torch path
    assert out.shape == (1, 4, 2, 64) and torch.isfinite(out).all()


def test_a_row_that_may_see_nothing_gives_zeros_and_others_are_untouched():
    q, k, v = torch.randn(1, 2, 2, 64), torch.randn(1, 2, 6, 64), torch.randn(1, 2, 6, 64)
    mask = torch.ones(1, 1, 2, 6, dtype=torch.bool)
    mask[0, 0, 0] = False
    out = ea.native_attention(q, k, v, mask, 0.125)
    assert torch.equal(out[:, :, 0], torch.zeros(1, 2, 64))
    assert torch.equal(out[:, :, 1], ea.native_attention(q[:, :, 1:], k, v, None, 0.125)[:, :, 0])


def random_tree_masks(B: int, T: int, S: int, seed: int) -> torch.Tensor:
    """bool [B, 1, T, S]: the prefix, then ancestors in a random forest (reference.ancestor_mask), per batch item."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, 1, T, S, dtype=torch.bool)
    mask[..., : S - T] = True
    for b in range(B):
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, T)]
        mask[b, 0, :, S - T:] = ancestor_mask(parents)
    return mask


def lean_cache(B: int, Hkv: int, S: int, D: int, dtype, seed: int):
    """Keys and values as LeanModel's attention gets them: [L, 2, B, Hkv, capacity, D] sliced to [:S]."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(3, 2, B, Hkv, S + 37, D, generator=g, dtype=dtype)
    return kv[1, 0, :, :, :S], kv[1, 1, :, :, :S]


def assert_grouped_is_per_row(q, k, v, mask, scale, blocks=(1, 4, 16)):
    per_row = ea.native_attention(q, k, v, mask, scale, block=0)
    for block in blocks:
        grouped = ea.native_attention(q, k, v, mask, scale, block=block)
        assert torch.equal(grouped.view(torch.int32), per_row.view(torch.int32)), f"block {block}"  # bits, signed zeros too
    assert torch.equal(ea.native_attention(q, k, v, mask, scale), per_row)  # as routed


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(saved)


@pytest.mark.parametrize("Hq, Hkv, D", [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 40)])
def test_the_grouped_kernel_gives_each_row_the_per_row_kernels_bits(threads, Hq, Hkv, D):
    for seed, (B, T, P) in enumerate([(1, 1, 150), (1, 7, 90), (2, 16, 50), (1, 40, 260)]):
        k, v = lean_cache(B, Hkv, P + T, D, torch.float32, seed)
        q = torch.randn(B, Hq + Hkv, T, D, generator=torch.Generator().manual_seed(seed))[:, :Hq]  # a view, as LeanModel's
        mask = random_tree_masks(B, T, P + T, seed)
        if B > 1:
            mask[1, :, :, :5] = False  # left padding: batch item 1's first 5 positions are nobody's keys ...
            mask[1, :, :3] = False  # ... and its first 3 rows see nothing
        assert_grouped_is_per_row(q, k, v, mask, D**-0.5)
        assert_grouped_is_per_row(q, k, v, ea.prepare_mask(mask, Hq, Hkv), D**-0.5)  # as LeanModel passes it
        assert_grouped_is_per_row(q, k, v, None, D**-0.5)  # causal: row t sees keys j <= S - T + t


def test_a_causal_prefill_of_more_than_128_rows_and_large_scores(monkeypatch, threads):
    """One call of 300 causal rows (the torch path cuts it in 128-row blocks; the C kernels do not), and
    scores far apart: exp(s - m) of arguments below -87 is 0, as in float32 it all but is."""
    k, v = lean_cache(1, 3, 310, 64, torch.float32, 5)
    q = torch.randn(1, 9, 300, 64, generator=torch.Generator().manual_seed(5))
    assert_grouped_is_per_row(q, k, v, None, 0.125)
    big = q * 120
    scores = big[0, 0].double() @ k[0, 0].T.double() * 0.125  # head 0, causal limits aside
    assert (scores.amax(-1) - scores.amin(-1)).max() > 512
    assert_grouped_is_per_row(big, k, v, None, 0.125)
    # scores up to about 10^3 carry float32's rounding (an ulp is 6e-5 there) into every exp(s - m)
    assert torch.allclose(ea.native_attention(big, k, v, None, 0.125), torch_path(monkeypatch, big, k, v, None),
                          rtol=0, atol=1e-4)


def test_routing():
    """Tokens a task: of the blocks giving every thread a task, the fewest empty rows in the tiles of 4,
    then two tasks a thread, then the largest block; the per-row kernel where a row would be alone in its
    task or there are fewer tasks than threads."""
    assert ea.tokens_per_task(1, 9, 3, 1, threads=2) == 16  # 3 tasks of one token: T = 1 with 3 query heads a kv head
    assert ea.tokens_per_task(1, 9, 3, 2, threads=2) == 1  # 6 tasks of 3 rows: as empty as 3 of 6, twice the tasks
    assert ea.tokens_per_task(1, 9, 3, 4, threads=2) == 16  # 3 tasks of 12 rows: no empty row (blocks of 2: 4)
    assert ea.empty_rows(3, 4, 4) == 0 and ea.empty_rows(3, 4, 2) == 4 and ea.empty_rows(3, 5, 4) == 1
    assert ea.tokens_per_task(1, 9, 3, 8, threads=2) == 4  # 6 tasks
    assert ea.tokens_per_task(1, 9, 3, 769, threads=2) == 16
    assert ea.tokens_per_task(1, 32, 32, 1, threads=2) is None  # one row a task: the per-row kernel
    assert ea.tokens_per_task(1, 32, 32, 4, threads=2) == 16
    assert ea.tokens_per_task(1, 9, 3, 1, threads=8) is None  # 3 tasks, 8 threads
    assert ea.tokens_per_task(1, 9, 3, 4, threads=8) == 1  # 12 tasks
