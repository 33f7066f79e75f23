"""The exact attention's C kernel (kernels/exact_attention.c) against its torch float64 path.

The kernel must give the torch path's results (both are float64 rounded once to float32), a tree
row the bits of a one-token pass over the keys it sees, the same bits from float32 and float64
storage, and zeros for a row that may see nothing. The other tests of the exact attention
(test_exact.py) run on whichever path this machine takes.
"""

from __future__ import annotations

import pytest
import torch

from spectui.kernels import exact_attention as ea
from spectui.kernels import native

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


@pytest.mark.parametrize("Hq, Hkv, D, T, S", [(9, 3, 64, 1, 200), (9, 3, 64, 8, 120), (4, 4, 32, 5, 5), (8, 1, 64, 130, 140)])
@pytest.mark.parametrize("masked", [False, True])
def test_the_kernel_gives_the_torch_paths_results(monkeypatch, Hq, Hkv, D, T, S, masked):
    torch.manual_seed(T + S)
    q, k, v = torch.randn(1, Hq, T, D), torch.randn(1, Hkv, S, D), torch.randn(1, Hkv, S, D)
    mask = tree_mask(T, S, seed=S) if masked else None
    got = ea.native_attention(q, k, v, mask, D**-0.5)
    assert got is not None
    expected = torch_path(monkeypatch, q, k, v, mask)
    assert torch.allclose(got, expected, rtol=0, atol=1e-6)
    assert (got != expected).float().mean() < 1e-3  # the same float64 quantities, rounded once: nearly all equal bits


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


def test_float32_and_float64_storage_give_the_same_bits_and_strided_caches_work():
    torch.manual_seed(1)
    q = torch.randn(1, 9, 3, 64)
    cache = torch.randn(2, 1, 3, 256, 64)  # [2, B, Hkv, capacity, D]: a preallocated cache, 100 positions used
    k, v = cache[0, :, :, :100], cache[1, :, :, :100]
    mask = tree_mask(3, 100, seed=1)
    f32 = ea.native_attention(q, k, v, mask, 0.125)
    f64 = ea.native_attention(q, k.double(), v.double(), mask, 0.125)
    assert torch.equal(f32, f64)
    assert torch.equal(f32, ea.native_attention(q, k.contiguous(), v.contiguous(), mask, 0.125))


def test_what_the_kernel_does_not_take_goes_to_torch():
    q, k, v = torch.randn(1, 4, 2, 64), torch.randn(1, 4, 10, 64), torch.randn(1, 4, 10, 64)
    additive = torch.zeros(1, 1, 2, 10)
    assert ea.native_attention(q, k, v, additive, 0.125) is None  # an additive mask
    assert ea.native_attention(q.double(), k.double(), v.double(), None, 0.125) is None  # not a float32 query
    assert ea.native_attention(q, k, v.double(), None, 0.125) is None  # keys and values unlike
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
