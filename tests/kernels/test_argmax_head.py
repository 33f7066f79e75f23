"""The bf16 screen of the output layer (kernels/argmax_head.py) gives the fp32 head's argmax, always.

Rows with planted near-ties must fall back to the canonical product; every other row is decided by
its candidates; and the screen's error bound must hold with room to spare on rows like the
verifier's (large norm, a few dominant logits)."""

import pytest
import torch

from spectui.kernels import dense_cpu, screen_int8
from spectui.kernels.argmax_head import ArgmaxScreen, screen_supported
from spectui.kernels.guarded_head import GuardedHead


def head_and_rows(seed: int, V: int = 4096, D: int = 576, M: int = 24, ties: bool = True):
    g = torch.Generator().manual_seed(seed)
    W = torch.nn.Parameter(torch.randn(V, D, generator=g) * 0.05, requires_grad=False)
    X = torch.randn(M, D, generator=g) * 2
    with torch.no_grad():
        for r in range(0, M, 2):  # even rows: two tokens a and b lifted to the top, ...
            a, b = (r * 37) % V, (r * 37 + 1) % V
            if ties:  # ... scoring within ~1e-6 of each other
                W[b] = W[a] + 1e-7 * torch.randn(D, generator=g)
            X[r] += 20 * W[a] / W[a].norm()
    return GuardedHead(W), X


PRODUCTS = [
    "torch",
    pytest.param("int8", marks=pytest.mark.skipif(not screen_int8.available(), reason="the int8 screen does not build here")),
    pytest.param("dense", marks=pytest.mark.skipif(not dense_cpu.available(), reason="the AVX2 product does not serve this CPU")),
    pytest.param("dot", marks=pytest.mark.skipif(not dense_cpu.dot_available(), reason="the AVX512-BF16 loop does not serve this CPU")),
]


@pytest.mark.parametrize("product", PRODUCTS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rows", [1, 4])  # a one-token step (ArgmaxScreen.decide_one), a tree pass
def test_the_screen_gives_the_canonical_argmax(seed, product, rows):
    head, X = head_and_rows(seed)
    screen = ArgmaxScreen(head, product)
    calls, tokens = [], []
    in_c = screen.decide is not None and screen.screen_in_c(X[:rows]) is not None  # a C product serves `rows`
    for i in range(0, len(X), rows):  # `rows` a call
        calls.append(screen(X[None, i:i + rows])[0])
        tokens.append(screen.tokens)
    got = torch.cat(calls)  # [M, V]
    canonical = torch.stack([head.canonical(x) for x in X])  # the one-token way, row by row
    assert torch.equal(got.argmax(-1), canonical.argmax(-1))
    if in_c:  # a C decision names each row's token, planted ties' included
        assert [t for call in tokens for t in call] == canonical.argmax(-1).tolist()
    else:  # torch's product (dot beyond dot_rows() rows on AMX CPUs): the caller scans the logits
        assert all(t is None for t in tokens)
    assert screen.recomputed >= 1  # planted ties went the canonical way ...
    assert screen.screened >= X.shape[0] // 2  # ... the other rows were decided by their candidates
    decided = torch.isfinite(got).sum(-1)  # [M]
    assert (decided < 64).sum() >= X.shape[0] // 2  # few candidates where the screen decided


@pytest.mark.parametrize("M", [1, 3, 24])
@pytest.mark.parametrize("product", PRODUCTS)
def test_each_screens_error_bound_holds_with_room(M, product):
    """Whichever product screens M rows (dot: the C loop up to its column limit, torch's beyond)."""
    head, X = head_and_rows(11, ties=False, M=M)
    screen = ArgmaxScreen(head, product)
    norms = X.norm(dim=-1) * (1 + 1e-5)
    g, r = screen.screen(X, norms)  # [V, M]
    exact = head.weight.double() @ X.double().T  # [V, M]
    assert float(((g.double() - exact).abs() / r.double()).max()) < 0.6


def test_the_screens_error_bound_holds_with_room():
    head, X = head_and_rows(7, ties=False)
    screen = ArgmaxScreen(head, "torch")
    hi = X.to(torch.bfloat16)
    lo = (X - hi.float()).to(torch.bfloat16)
    M = X.shape[0]
    G = (screen.low @ torch.cat([hi, lo]).T).float()
    g = G[:, :M] + G[:, M:]
    exact = head.weight.double() @ X.double().T  # [V, M]
    r = ((screen.rounding_norm + screen.residue * screen.row_norm)[:, None] * X.norm(dim=-1)
         + 2.0**-7 * (G[:, :M].abs() + G[:, M:].abs()))
    assert float(((g.double() - exact).abs() / r.double()).max()) < 0.6



@pytest.mark.parametrize("M,V", [(1, 4096), (3, 4101), (8, 4096)])
@pytest.mark.parametrize("product", PRODUCTS[1:])
def test_the_decision_in_c_picks_the_sets_and_tokens_torch_picks(M, V, product):
    """kernels/screen_decide.c against the torch ops: its candidates are C = {v : g_v + r_v >= max(g - r) -
    slack}, and its tokens those of decide_in_torch (V = 4101: the vector loops' last tokens go one at a
    time)."""
    head, X = head_and_rows(5, V=V, ties=False, M=M)
    X[0] = 0  # a flat row: every token a candidate, more than the C list holds
    screen = ArgmaxScreen(head, product)
    if product == "dot" and M > screen.dot_rows:  # torch's product serves these rows (AMX CPUs: dot_rows() 2)
        assert screen.screen_in_c(X) is None
        pytest.skip(f"the vdpbf16ps loop screens at most {screen.dot_rows} rows on this CPU")
    assert screen.decide is not None and screen.screen_in_c(X) is not None
    norms = X.norm(dim=-1) * (1 + 1e-5)
    slack = 2 * screen.eps_per_norm * norms
    idx, count, token, logit = screen.decide_in_c(X, screen.screen_in_c(X), norms, slack)
    g, r = screen.screen(X, norms)  # [V, M]: the same product, bounds in torch
    inside = (g + r) >= ((g - r).max(dim=0).values - slack)  # [V, M]
    assert int(count[0]) > 256 and int(token[0]) == -1 and int(inside[:, 0].sum()) == V  # the flat row: canonical
    if M > 1:  # the other rows (the flat one would fill torch's union)
        union, mine = screen.candidates(X[1:], norms[1:], slack[1:])
        _, clear = screen.decide_in_torch(X[1:], union, mine)
    for m in range(1, M):
        assert torch.equal(idx[m, : count[m]], inside[:, m].nonzero().flatten())
        assert 1 <= int(count[m]) < 64
        assert bool(clear[m - 1]) == (int(token[m]) >= 0)  # decided, or a near-tie for both
        if token[m] >= 0:
            assert int(token[m]) == int(head.canonical(X[m]).argmax())
            assert float(logit[m]) == pytest.approx(float(head.weight[token[m]] @ X[m]), rel=1e-5)
    assert int((token[1:] >= 0).sum()) >= (M - 1) // 2
    got = screen(X)  # the flat row goes the canonical way
    assert screen.recomputed >= 1 and int(got[0].argmax()) == int(head.canonical(X[0]).argmax())
    strided = torch.cat([X, X], dim=1)[:, : X.shape[1]]  # rows 2D apart: what the C code reads must be x's rows
    assert torch.equal(screen(strided).argmax(-1), torch.stack([head.canonical(x) for x in X]).argmax(-1))
