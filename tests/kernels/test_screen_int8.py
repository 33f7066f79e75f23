"""The output screen's int8 product (kernels/screen_int8.py): it computes exactly the integer
product its docstring states, its bound holds, and the screen that uses it still gives the fp32
head's argmax."""

import pytest
import torch

from spectui.kernels import screen_int8
from spectui.kernels.argmax_head import ArgmaxScreen
from spectui.kernels.guarded_head import GuardedHead

pytestmark = pytest.mark.skipif(not screen_int8.available(), reason="the int8 screen needs AVX2 and a C compiler")


def layer(seed: int, V: int = 4096, D: int = 576) -> torch.Tensor:
    """Rows like an output layer's, with a heavy column, a few large entries and one all-zero row."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, D, generator=g) * 0.05
    W[:, 3] *= 8
    W[torch.randint(0, V, (50,), generator=g), torch.randint(0, D, (50,), generator=g)] = 1.5
    W[17] = 0
    return W


def torch_levels(x: torch.Tensor):
    """screen_int8.py's two input levels written as torch ops: codes [M, 2, D], t [M], rho [M]."""
    t_hi = (x.abs().amax(dim=1, keepdim=True) / 127).clamp_min(2.0**-100)
    t = t_hi / 128
    p_hi = torch.round(x / t_hi).clamp_(-127, 127)
    r = x.double() - t_hi.double() * p_hi
    p_lo = torch.round(r / t.double()).clamp_(-127, 127)
    delta = r - t.double() * p_lo
    rho = delta.norm(dim=1) / x.double().norm(dim=1).clamp_min(1e-300)
    return (torch.stack([p_hi, p_lo.float()], dim=1) + 128).to(torch.uint8), t.reshape(-1), rho


def test_the_c_levels_are_the_torch_levels():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 576, generator=g) * 3
    x[1] = 0  # a zero row: the smallest step, all codes 128
    x[2, 5] = 300  # a massive activation
    x[3] = torch.round(torch.randn(576, generator=g) * 50) / 2  # exact halves: ties to even in both
    x[4, :] = 1e-30
    screen = screen_int8.Int8Screen(layer(0, V=64))
    codes, t, rho = screen.levels(x)
    want_codes, want_t, want_rho = torch_levels(x)
    assert torch.equal(codes, want_codes) and torch.equal(t, want_t)
    assert want_rho.max() <= rho <= float(want_rho.max()) * (1 + 2e-6) + 1e-12


@pytest.mark.parametrize("M,V", [(1, 4096), (2, 4099), (3, 4098), (5, 4097)])
def test_the_c_product_is_the_stated_integer_product(M, V):
    """g = float(s_v t (q_v . (128 p_hi + p_lo))) with q_v = round(W_v / s_v): the blocked C loop
    (rows in blocks of 4, a short last block when V % 4 != 0, input rows in pairs and a last one)
    gives these bits."""
    W = layer(M, V=V)
    screen = screen_int8.Int8Screen(W)
    x = torch.randn(M, W.shape[1], generator=torch.Generator().manual_seed(M)) * 3
    got, _ = screen(x)
    scale = W.abs().amax(dim=1) / 127  # [V] fp32, as the C side divides (an all-zero row: 1e-30)
    scale = torch.where(scale > 1e-30, scale, torch.tensor(1e-30))
    assert torch.equal(scale, screen.scale)
    q = torch.round(W / scale[:, None]).clamp(-127, 127).long()  # [V, D]
    codes, t, _ = screen.levels(x)
    p = 128 * (codes[:, 0].long() - 128) + (codes[:, 1].long() - 128)  # [M, D]
    A = p @ q.T  # [M, V], exact in int64
    want = (screen.scale.double()[None] * (t.double()[:, None] * A.double())).float()
    assert torch.equal(got, want)


@pytest.mark.parametrize("M", [1, 2, 5, 16])
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


def test_the_screen_takes_int8_and_keeps_the_argmax():
    W = layer(3)
    head = GuardedHead(torch.nn.Parameter(W, requires_grad=False))
    screen = ArgmaxScreen(head)  # this CPU's default product: the int8 copy wherever it builds
    assert screen.int8 is not None
    g = torch.Generator().manual_seed(9)
    X = torch.randn(12, W.shape[1], generator=g) * 2
    for r in range(0, 12, 3):  # some rows with a clear winner, one with a planted near-tie
        a = (r * 91) % W.shape[0]
        X[r] += 20 * W[a] / W[a].norm()
    W_tie = W.clone()
    W_tie[1] = W_tie[0] + 1e-7 * torch.randn(W.shape[1], generator=g)
    X[1] += 25 * W_tie[0] / W_tie[0].norm()
    head = GuardedHead(torch.nn.Parameter(W_tie, requires_grad=False))
    screen = ArgmaxScreen(head)
    picked = screen.screen_in_c(X[:1])
    assert screen.product == "int8" and picked is not None and not hasattr(screen, "low")  # int8's alone: no bf16 copy
    got = torch.cat([screen(X[:1]), screen(X[1:3]), screen(X[3:])])  # [12, V]: calls of 1, 2 and 9 rows
    canonical = torch.stack([head.canonical(x) for x in X])
    assert torch.equal(got.argmax(-1), canonical.argmax(-1))
    assert screen.recomputed >= 1 and screen.screened >= 8  # the near-tie went the canonical way


def test_a_drafters_output_layer_reads_the_int8_copy_within_the_screens_bound():
    from spectui.kernels import dense_cpu

    W = layer(6, V=dense_cpu.INT8_MIN_ROWS + 3, D=128).to(torch.bfloat16)  # like the boost SSM's 49,152 x 128
    kernel = dense_cpu.drafter_kernel(W)
    assert isinstance(kernel, dense_cpu.Int8Kernel)
    assert not isinstance(dense_cpu.drafter_kernel(W[:512]), dense_cpu.Int8Kernel)  # a small layer: not the int8 copy
    assert not isinstance(dense_cpu.drafter_kernel(W, torch.zeros(W.shape[0])), dense_cpu.Int8Kernel)  # nor with a bias
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(2))
    got = kernel(x)  # [2, 3, V]
    exact = x.reshape(-1, 128).double() @ W.double().T
    _, bound = kernel.screen(x.reshape(-1, 128))
    allowed = bound.double()[None] * x.reshape(-1, 128).double().norm(dim=1, keepdim=True) + 2.0**-20 * exact.abs() + 1e-6
    assert got.shape == (2, 3, W.shape[0]) and bool(((got.reshape(6, -1).double() - exact).abs() <= allowed).all())
