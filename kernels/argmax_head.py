"""The verifier's greedy token from a bf16 screen of its output layer, exact against the fp32 head.

Greedy decoding reads one thing from the output layer: the argmax of each row's logits. The fp32
layer W [V, D] (49,152 x 576 for SmolLM2, 113 MB) costs 8.5 ms a row here, about 40 % of a
one-token step, and reading it is most of that. With AVX512-BF16, a bf16 copy of W is read four
to six times faster (1.3-2.2 ms for 1 to 8 rows). The bf16 logits are not the verifier's, but a
rounding bound turns them into a short list of candidates that surely holds the verifier's
argmax, and the candidates' fp32 logits decide among them (guarded_head.py's argument).

For a row x (fp32), with W_hi = bf16(W), dW = W - W_hi, and x = x_hi + x_lo + x_r (x_hi = bf16(x),
x_lo = bf16(x - x_hi), |x_r| <= 2^-16 |x| elementwise), the screen computes in one bf16 product

    G = W_hi @ [x_hi, x_lo]^T      (fp32 accumulation, each column rounded to bf16)   [V, 2]
    g = G[:, 0] + G[:, 1]

and the exact logit s_v = w_v . x differs from g_v by at most

    r_v = |dW_v| |x|                          W's rounding (Cauchy-Schwarz; |dW_v| kept from load)
        + (2^-16 + 2 gamma_D) |W_v| |x|       x's residue and the fp32 accumulation
        + 2^-7 (|G_v0| + |G_v1|)              the bf16 rounding of the product (2x the 2^-8 bound)
        + 2^-20 |g_v| + 1e-30                 the fp32 sums here

(gamma_D = D u / (1 - D u), u = 2^-24: Higham's bound for any summation order). The fp32 head's
logit f_v (guarded_head.py's canonical product) is within eps_v = gamma_D |W_v| |x| of s_v, so its
argmax a* satisfies s_a* >= max_v (g_v - r_v) - 2 eps_max =: L, and lies in

    C = { v : g_v + r_v >= L }.

For the candidates, fp32 logits h_v (any order) with per-token bounds e_v = gamma_D sum_i |w_vi x_i|
decide: if the best candidate a beats every other by more than 2 (e_a + e_v), the canonical argmax
is a. A row where that fails (a true near-tie, about 1 in 100) or where C is large is computed the
canonical way.

Which product computes G, by measurement (2 threads, 49,152 x 576, ms for 2M columns):

  * torch's bf16 product through oneDNN: with AMX tiles (Intel Xeon) 1.2-1.5 for 1 to 16 columns.
    Without AMX (AMD EPYC with AVX512-BF16) 4.8-5.9 whatever the columns, where streaming the bf16
    copy takes about 2.
  * kernels/dense_cpu.c's vdpbf16ps loop (DOT, exact products of bf16 operands summed in fp32, no
    bf16 rounding of the result): on that EPYC 2.2-2.5 for 2 or 4 columns, 4.3 for 8, 8.2 for 16;
    on the Xeon 1.05 for one column, 1.35 for two. DOT screens x_hi alone, one column a row (see
    ArgmaxScreen: a wider bound, about two candidates a row more, for half the columns), so it
    takes up to dot_rows() rows: 8 without AMX, 2 with it.
  * on AVX2 CPUs without AVX512-BF16 (where torch's bf16 product is slow), dense_cpu.c's product of
    the bf16 copy with x in fp32, summed in fp32 (DENSE: 4.5 ms a row against the fp32 head's 6.5-8
    ms on a 2-core AMD EPYC, 10 ms against 12-17 for 8 rows, scripts/profile_step.py).
  * wherever kernels/screen_int8.c builds (AVX512-VNNI, or AVX2 alone), an int8 copy of W instead of
    either bf16 product (screen_int8.py has its bound): half the bytes, and faster at every row count
    (on that AVX2 EPYC 1.1-1.3 ms a row against DENSE's 3.4-4.7).

The fp32-summed products lose the last term of the bound (no bf16 rounding of G) and change the
rest (ArgmaxScreen's docstring); the candidates and the near-tie rule are the same for all three.
After a C product the rest is C too (kernels/screen_decide.c): the candidates C (two passes over V
a row with the fp32 arithmetic of the torch ops it replaced), then their fp32 logits, their bounds
and the rule below, one call for every row; it replaced a dozen torch ops and a Python loop (on the
AVX2 EPYC, 2 threads: 0.52 -> 0.05 ms for one row, about 2.4 -> 0.12 ms for 8 rows).

The rows returned are argmax-only: the decided token's fp32 logit (after a C product; every
candidate's after torch's), -inf elsewhere. Only greedy
decoding that displays nothing may use them (LeanModel.argmax_only); sampling and display read
the full head.
"""

from __future__ import annotations

import ctypes as ct

import torch

from . import dense_cpu, native, screen_int8

U32 = 2.0**-24  # unit roundoff of float32
MAX_CANDIDATES = 256  # more than this (a flat row): the canonical product is as cheap
I64, PTR = ct.c_int64, ct.c_void_p
# spectui_screen_decide(M, V, D, g, bound, norm, slack, cap, W, x, ldx, c, idx, count, token, logit, threads)
DECIDE_ARGS = [I64, I64, I64, PTR, PTR, PTR, PTR, I64, PTR, PTR, I64, ct.c_float, PTR, PTR, PTR, PTR, ct.c_int]


def dot_rows() -> int:
    """The most rows (one column each: x_hi) the vdpbf16ps loop screens before torch's product is as fast."""
    return 2 if torch.cpu._is_amx_tile_supported() else 8


def default_product(columns: int) -> str:
    """The screen's product on this CPU: an int8 copy wherever screen_int8.c builds (AVX512-VNNI or
    AVX2) and the layer fits it, else dense_cpu.c's bf16 products, else torch's."""
    if screen_int8.available() and screen_int8.fits(columns):
        return "int8"
    return "dense" if dense_cpu.available() else "dot" if dense_cpu.dot_available() else "torch"


def screen_supported() -> bool:
    """The screen pays where the CPU computes bf16 natively (AVX512-BF16) or where kernels/dense_cpu.c
    serves it (AVX2 without AVX512-BF16); on both, default_product() takes the int8 copy where
    screen_int8.c builds, else the bf16 product."""
    return torch.cpu._is_avx512_bf16_supported() or dense_cpu.available()


class ArgmaxScreen:
    """Argmax-exact logits of `head` (a GuardedHead) for rows of hidden states.

    product: "int8" (screen_int8.c's copy, its own bound; no bf16 copy is made), "dense" (dense_cpu.c,
    x in fp32; AVX2 CPUs), "dot" (dense_cpu.c's vdpbf16ps loop up to dot_rows() rows, torch's product
    beyond) or "torch"; None: default_product(), the one for this CPU.

    DENSE computes g = W_hi @ x with x in fp32 and sums in fp32:

        |s_v - g_v| <= |dW_v| |x| + gamma_D |W_hi_v| |x|,    |W_hi_v| <= |W_v| + |dW_v|

    DOT computes g_v = W_hi_v . x_hi alone, exact products summed in fp32. With s_v - g_v =
    dW_v . x + W_hi_v . (x - x_hi) + (the sum's rounding), |x - x_hi| <= 2^-8 |x| (bf16 rounds to
    8 significant bits) and |x_hi| <= (1 + 2^-8) |x|:

        |s_v - g_v| <= |dW_v| |x| + (2^-8 + gamma_D (1 + 2^-8)) |W_hi_v| |x| + 2^-20 |g_v|

    The x_hi term is about the size of the |dW_v| term, so the bound is about 2.7x the two-column
    one (x_hi and x_lo) it replaced: on the verifier's rows 3.0 candidates a row instead of 1.4 (at
    most 14 over 400 rows of a summary), for one column a row instead of two. Verify step on a
    2-core AMD EPYC, prefix 200: T = 1 13.4 -> 12.9 ms, T = 4 18.6 -> 16.7, T = 8 25.1 -> 23.1.
    """

    def __init__(self, head, product: str | None = None) -> None:
        W = head.weight.detach()  # [V, D] fp32
        V, D = W.shape
        self.head = head
        product = product or default_product(D)
        self.product = product
        self.dot_rows = dot_rows()
        self.int8 = screen_int8.Int8Screen(W) if product == "int8" else None  # its own copy and bound
        wide = W.double()
        self.row_norm = (wide.norm(dim=1) * (1 + 1e-6)).float()  # |W_v| [V]
        self.gamma = D * U32 / (1 - D * U32)
        self.residue = 2.0**-16 + 2 * self.gamma
        self.eps_per_norm = self.gamma * float(self.row_norm.max()) * (1 + 1e-3)
        if product != "int8":  # a bf16 copy, the product that reads it, and their bounds
            self.low = W.to(torch.bfloat16)  # [V, D]
            make = {"dense": dense_cpu.dense, "dot": dense_cpu.bf16_dot, "torch": lambda w: None}[product]
            self.kernel = make(self.low)  # shares self.low
            if product != "torch" and self.kernel is None:
                raise RuntimeError(f"kernels/dense_cpu.c's {product} product does not serve this CPU")
            self.rounding_norm = ((wide - self.low.double()).norm(dim=1) * (1 + 1e-6)).float()  # |dW_v| [V]
            low_norm = self.row_norm + self.rounding_norm  # >= |W_hi_v|
            self.kernel_bound = self.rounding_norm + self.gamma * (1 + 1e-3) * low_norm  # [V]: DENSE
            self.dot_bound = self.rounding_norm + (2.0**-8 + self.gamma * (1 + 2.0**-8) * (1 + 1e-3)) * low_norm  # DOT
        self.decide = (native.function("screen_decide", "spectui_screen_decide", DECIDE_ARGS)[0]
                       if product != "torch" and D % 8 == 0 else None)
        # the decision after a C product in C (None where screen_decide.c did not build: then in torch)
        self.weight = W.float().contiguous()  # [V, D] fp32, what the C decision reads (no copy: GuardedHead's)
        self.screened = 0  # rows decided from the screen
        self.recomputed = 0  # rows computed the canonical way
        self.tokens: list[int] | None = None  # the last call's argmax of each row, where it knew them at no cost

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] fp32 -> argmax-only logits [..., V] (see the module docstring)."""
        lead = hidden.shape[:-1]
        x = hidden.reshape(-1, hidden.shape[-1]).float()  # [M, D]
        M = x.shape[0]
        norms = x.norm(dim=-1) * (1 + 1e-5)  # [M]
        slack = 2 * self.eps_per_norm * norms
        picked = self.screen_in_c(x) if self.decide is not None else None
        self.tokens = None
        if picked is None:
            union, mine = self.candidates(x, norms, slack)  # [U], [M, U]: C per row
            if M == 1 and 0 < len(union) <= MAX_CANDIDATES:  # a one-token step: the same decision, fewer ops
                return self.decide_one(x[0], union).view(*lead, -1)
            out, clear = self.decide_in_torch(x, union, mine)
            undecided = (~clear).nonzero().flatten().tolist()
        else:  # g [M, V] from a C product: the rest in C too
            _, _, token, logit = self.decide_in_c(x, picked, norms, slack)
            out = torch.full((M, self.head.weight.shape[0]), float("-inf"))
            undecided = []
            for row, (t, h) in enumerate(zip(token.tolist(), logit.tolist())):
                if t >= 0:
                    out[row, t] = h  # a decided row: its token's fp32 logit alone
                else:
                    undecided.append(row)
        for row in undecided:  # near-ties and flat rows: the canonical way
            out[row] = self.head.canonical(x[row])
        if picked is not None:  # each row's argmax, so that a caller need not scan V columns a row for it
            self.tokens = [t if t >= 0 else int(out[row].argmax()) for row, t in enumerate(token.tolist())]
        self.recomputed += len(undecided)
        self.screened += M - len(undecided)
        return out.view(*lead, -1)

    def decide_in_c(self, x: torch.Tensor, picked: tuple[torch.Tensor, torch.Tensor], norms: torch.Tensor,
                    slack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [M, D], (g [M, V], bound [V]) from a C product -> (idx [M, cap] and count [M]: the candidates
        C per row; token [M]: the argmax, -1 where the canonical product must decide; logit [M]: its h)."""
        g, bound = picked
        M, V = g.shape
        g, bound = g.float().contiguous(), bound.float().contiguous()
        norms, slack = norms.float().contiguous(), slack.float().contiguous()
        W = self.weight
        x = x if x.stride(-1) == 1 else x.contiguous()
        idx = torch.empty(M, MAX_CANDIDATES, dtype=torch.long)
        count, token = torch.empty(M, dtype=torch.long), torch.empty(M, dtype=torch.long)
        logit = torch.empty(M, dtype=torch.float32)
        self.decide(M, V, x.shape[1], g.data_ptr(), bound.data_ptr(), norms.data_ptr(), slack.data_ptr(),
                    MAX_CANDIDATES, W.data_ptr(), x.data_ptr(), x.stride(0), self.gamma * (1 + 1e-3), idx.data_ptr(),
                    count.data_ptr(), token.data_ptr(), logit.data_ptr(), torch.get_num_threads())
        return idx, count, token, logit

    def decide_in_torch(self, x: torch.Tensor, union: torch.Tensor,
                        mine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] and the candidates (union [U], mine [M, U]) -> (argmax-only logits [M, V], clear [M])."""
        M = x.shape[0]
        out = torch.full((M, self.head.weight.shape[0]), float("-inf"))
        if not 0 < len(union) <= MAX_CANDIDATES * M:  # (none: every row flat or NaN)
            return out, torch.zeros(M, dtype=torch.bool)
        w = self.head.weight[union]  # [U, D]
        h = (w @ x.T).T  # [M, U] fp32 logits of the candidates
        e = (self.gamma * (1 + 1e-3)) * (x.abs() @ w.abs().T)  # [M, U] per-token bounds
        h_mine = torch.where(mine, h, float("-inf"))
        best = h_mine.argmax(dim=1, keepdim=True)  # [M, 1]
        gap = h.gather(1, best) - h  # [M, U]
        margin = 2 * (e.gather(1, best) + e)
        rival = mine & (torch.arange(len(union)) != best)  # other candidates of the row
        count = mine.sum(dim=1)
        clear = ~(rival & (gap <= margin)).any(dim=1) & (count <= MAX_CANDIDATES) & (count > 0)  # [M]
        out[:, union] = torch.where(clear[:, None] & mine, h, float("-inf"))
        return out, clear

    def decide_one(self, x: torch.Tensor, union: torch.Tensor) -> torch.Tensor:
        """One row x [D] and its candidates [U] (1 <= U <= MAX_CANDIDATES) -> argmax-only logits [V]: the
        rule of __call__ (the first best h_a; clear if h_a - h_v > 2 (e_a + e_v) for every other v)
        with the candidates' few numbers compared in Python, not by a dozen tensor ops."""
        w = self.head.weight[union]  # [U, D]
        h = torch.mv(w, x)  # [U] fp32 logits (any order: e bounds it)
        e = torch.mv(w.abs(), x.abs()).mul_(self.gamma * (1 + 1e-3)).tolist()  # [U] per-token bounds
        hs = h.tolist()
        best = max(range(len(hs)), key=hs.__getitem__)  # the first best, as argmax
        clear = all(hs[best] - hs[v] > 2 * (e[best] + e[v]) for v in range(len(hs)) if v != best)
        if not clear:  # a near-tie: the canonical way
            self.recomputed += 1
            return self.head.canonical(x)
        self.screened += 1
        out = torch.full((self.head.weight.shape[0],), float("-inf"))
        out[union] = h
        return out

    def candidates(self, x: torch.Tensor, norms: torch.Tensor, slack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] fp32 -> (union [U], mine [M, U] bool): every row's candidates C (module docstring) in
        torch, slack = 2 eps_max |x| [M] (after a C product, decide_in_c picks them). A row with no
        candidate or more than MAX_CANDIDATES (a flat row) is computed the canonical way."""
        g, r = self.screen(x, norms)  # [V, M] each
        floor = (g - r).max(dim=0).values - slack  # [M]: L
        inside = (g + r) >= floor  # [V, M]: C per row
        union = inside.any(dim=1).nonzero().flatten()  # [U]
        return union, inside[union].T

    def screen_in_c(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(g [M, V], its bound per unit |x| [V]) where a C product serves these rows, else None."""
        if self.int8 is not None:  # an int8 copy of W: half the bytes (screen_int8.py has its bound); faster
            return self.int8(x)  # than the bf16 products and torch's at every row count (screen_int8.c)
        if self.product == "dense":
            return self.kernel(x), self.kernel_bound
        if self.product == "dot" and x.shape[0] <= self.dot_rows:
            return self.kernel.loop(x.to(torch.bfloat16)), self.dot_bound  # x_hi alone: one column a row
        return None

    def screen(self, x: torch.Tensor, norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] fp32 -> (g, r) [V, M]: screened logits and their error bounds (module docstring)."""
        M = x.shape[0]
        if (picked := self.screen_in_c(x)) is not None:
            g, bound = picked[0].T, picked[1]  # [V, M]
            return g, bound[:, None] * norms + 2.0**-20 * g.abs() + 1e-30
        hi = x.to(torch.bfloat16)
        lo = (x - hi.float()).to(torch.bfloat16)
        G = (self.low @ torch.cat([hi, lo]).T).float()  # [V, 2M]: columns x_hi rows, then x_lo rows
        g = G[:, :M] + G[:, M:]  # [V, M]
        r = ((self.rounding_norm + self.residue * self.row_norm)[:, None] * norms
             + 2.0**-7 * (G[:, :M].abs() + G[:, M:].abs()) + 2.0**-20 * g.abs() + 1e-30)  # [V, M]
        return g, r
