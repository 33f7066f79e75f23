"""The output screen's int8 product (kernels/screen_int8.py): its bound holds, and the screen that
uses it for one- and two-row calls still gives the fp32 head's argmax."""

import pytest
import torch

from spectui.kernels import screen_int8
from spectui.kernels.argmax_head import INT8_ROWS, ArgmaxScreen
from spectui.kernels.guarded_head import GuardedHead

pytestmark = pytest.mark.skipif(not screen_int8.available(), reason="the int8 screen needs AVX512-VNNI and a C compiler")


def layer(seed: int, V: int = 4096, D: int = 576) -> torch.Tensor:
    """Rows like an output layer's, with a heavy column, a few large entries and one all-zero row."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, D, generator=g) * 0.05
    W[:, 3] *= 8
    W[torch.randint(0, V, (50,), generator=g), torch.randint(0, D, (50,), generator=g)] = 1.5
    W[17] = 0
    return W


@pytest.mark.parametrize("M", [1, 2, 5])
def test_the_int8_products_error_stays_inside_its_bound(M):
    W = layer(M)
    screen = screen_int8.Int8Screen(W)
    assert screen.codes.dtype == torch.int8 and int(screen.codes.abs().max()) == 127
    g = torch.Generator().manual_seed(100 + M)
    worst = 0.0
    for trial in range(6):
        x = torch.randn(M, W.shape[1], generator=g) * 2
        x[:, 7] = 40 * (trial + 1)  # a massive activation: what a single int8 level would round badly
        x[0, ::5] *= 1e-4
        got, bound = screen(x)  # [M, V], [V]
        exact = x.double() @ W.double().T  # [M, V]
        allowed = bound.double()[None] * x.double().norm(dim=1, keepdim=True) + 2.0**-20 * got.double().abs() + 1e-30
        ratio = float(((got.double() - exact).abs() / allowed).max())
        worst = max(worst, ratio)
    assert worst <= 1.0
    assert worst > 1e-3  # the bound is not vacuous: the product's error is a visible part of it


def test_the_screen_takes_int8_for_short_calls_and_keeps_the_argmax():
    W = layer(3)
    head = GuardedHead(torch.nn.Parameter(W, requires_grad=False))
    screen = ArgmaxScreen(head, "dot")
    assert screen.int8 is not None and INT8_ROWS >= 1
    g = torch.Generator().manual_seed(9)
    X = torch.randn(12, W.shape[1], generator=g) * 2
    for r in range(0, 12, 3):  # some rows with a clear winner, one with a planted near-tie
        a = (r * 91) % W.shape[0]
        X[r] += 20 * W[a] / W[a].norm()
    W_tie = W.clone()
    W_tie[1] = W_tie[0] + 1e-7 * torch.randn(W.shape[1], generator=g)
    X[1] += 25 * W_tie[0] / W_tie[0].norm()
    head = GuardedHead(torch.nn.Parameter(W_tie, requires_grad=False))
    screen = ArgmaxScreen(head, "dot")
    picked = screen.screen_in_c(X[:1])
    assert picked is not None and picked[1] is not screen.dot_bound  # int8's bound, not the bf16 loop's
    got = torch.cat([screen(X[i:i + INT8_ROWS]) for i in range(0, 12, INT8_ROWS)])  # [12, V]
    canonical = torch.stack([head.canonical(x) for x in X])
    assert torch.equal(got.argmax(-1), canonical.argmax(-1))
    assert screen.recomputed >= 1 and screen.screened >= 8  # the near-tie went the canonical way
