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
  * kernels/dense_cpu.c's vdpbf16ps loop (DOT, exact products of the same bf16 operands summed in
    fp32, no bf16 rounding of the result): on that EPYC 2.2-2.5 for 2 or 4 columns, 4.3 for 8,
    8.2 for 16; on the Xeon 1.05 for one column, 1.35 for two. So it takes up to DOT_COLUMNS
    columns: 8 without AMX, 2 with it.
  * on AVX2 CPUs without AVX512-BF16 (where torch's bf16 product is slow), dense_cpu.c's product of
    the bf16 copy with x in fp32, summed in fp32 (DENSE: 4.5 ms a row against the fp32 head's 6.5-8
    ms on a 2-core AMD EPYC, 10 ms against 12-17 for 8 rows, scripts/profile_step.py).

The fp32-summed products lose the last term of the bound (no bf16 rounding of G) and keep the rest
(ArgmaxScreen's docstring); the candidates and the near-tie rule are the same for all three.

The rows returned are argmax-only: the candidates' fp32 logits, -inf elsewhere. Only greedy
decoding that displays nothing may use them (LeanModel.argmax_only); sampling and display read
the full head.
"""

from __future__ import annotations

import torch

from . import dense_cpu

U32 = 2.0**-24  # unit roundoff of float32
MAX_CANDIDATES = 256  # more than this (a flat row): the canonical product is as cheap


def dot_columns() -> int:
    """The most columns (2 a row: x_hi, x_lo) the vdpbf16ps loop screens before torch's product is as fast."""
    return 2 if torch.cpu._is_amx_tile_supported() else 8


def screen_supported() -> bool:
    """The bf16 product is fast where the CPU computes bf16 natively (AVX512-BF16) or where
    kernels/dense_cpu.c reads bf16 weights into fp32 products (AVX2 without AVX512-BF16)."""
    return torch.cpu._is_avx512_bf16_supported() or dense_cpu.available()


class ArgmaxScreen:
    """Argmax-exact logits of `head` (a GuardedHead) for rows of hidden states.

    product: "dense" (dense_cpu.c, x in fp32; AVX2 CPUs), "dot" (dense_cpu.c's vdpbf16ps loop up to
    DOT_COLUMNS columns, torch's product beyond) or "torch"; None: the one for this CPU.

    DENSE computes g = W_hi @ x with x in fp32 and sums in fp32:

        |s_v - g_v| <= |dW_v| |x| + gamma_D |W_hi_v| |x|,    |W_hi_v| <= |W_v| + |dW_v|

    DOT computes G_v0 = W_hi_v . x_hi and G_v1 = W_hi_v . x_lo, exact products summed in fp32, so
    with |x_hi| + |x_lo| <= (1 + 2^-7) |x|:

        |s_v - g_v| <= |dW_v| |x| + (2^-16 + gamma_D (1 + 2^-7)) |W_hi_v| |x| + 2^-20 |g_v|
    """

    def __init__(self, head, product: str | None = None) -> None:
        W = head.weight.detach()  # [V, D] fp32
        V, D = W.shape
        self.head = head
        self.low = W.to(torch.bfloat16)  # [V, D]
        product = product or ("dense" if dense_cpu.available() else "dot" if dense_cpu.dot_available() else "torch")
        make = {"dense": dense_cpu.dense, "dot": dense_cpu.bf16_dot, "torch": lambda w: None}[product]
        self.kernel = make(self.low)  # shares self.low
        if product != "torch" and self.kernel is None:
            raise RuntimeError(f"kernels/dense_cpu.c's {product} product does not serve this CPU")
        self.product = product
        self.dot_columns = dot_columns()
        wide = W.double()
        self.rounding_norm = ((wide - self.low.double()).norm(dim=1) * (1 + 1e-6)).float()  # |dW_v| [V]
        self.row_norm = (wide.norm(dim=1) * (1 + 1e-6)).float()  # |W_v| [V]
        self.gamma = D * U32 / (1 - D * U32)
        self.residue = 2.0**-16 + 2 * self.gamma
        self.eps_per_norm = self.gamma * float(self.row_norm.max()) * (1 + 1e-3)
        low_norm = self.row_norm + self.rounding_norm  # >= |W_hi_v|
        self.kernel_bound = self.rounding_norm + self.gamma * (1 + 1e-3) * low_norm  # [V]: DENSE
        self.dot_bound = self.rounding_norm + (2.0**-16 + self.gamma * (1 + 2.0**-7) * (1 + 1e-3)) * low_norm  # DOT
        self.screened = 0  # rows decided from the screen
        self.recomputed = 0  # rows computed the canonical way

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] fp32 -> argmax-only logits [..., V] (see the module docstring)."""
        lead = hidden.shape[:-1]
        x = hidden.reshape(-1, hidden.shape[-1]).float()  # [M, D]
        M = x.shape[0]
        norms = x.norm(dim=-1) * (1 + 1e-5)  # [M]
        g, r = self.screen(x, norms)  # [V, M] each
        floor = (g - r).max(dim=0).values - 2 * self.eps_per_norm * norms  # [M]: L
        inside = (g + r) >= floor  # [V, M]: C per row
        union = inside.any(dim=1).nonzero().flatten()  # [U]: every row's candidates
        out = torch.full((M, self.low.shape[0]), float("-inf"))
        if len(union) <= MAX_CANDIDATES * M:
            w = self.head.weight[union]  # [U, D]
            h = (w @ x.T).T  # [M, U] fp32 logits of the candidates
            e = (self.gamma * (1 + 1e-3)) * (x.abs() @ w.abs().T)  # [M, U] per-token bounds
            mine = inside[union].T  # [M, U]
            h_mine = torch.where(mine, h, float("-inf"))
            best = h_mine.argmax(dim=1, keepdim=True)  # [M, 1]
            gap = h.gather(1, best) - h  # [M, U]
            margin = 2 * (e.gather(1, best) + e)
            rival = mine & (torch.arange(len(union)) != best)  # other candidates of the row
            clear = ~(rival & (gap <= margin)).any(dim=1) & (mine.sum(dim=1) <= MAX_CANDIDATES)  # [M]
            out[:, union] = torch.where(clear[:, None] & mine, h, float("-inf"))
        else:
            clear = torch.zeros(M, dtype=torch.bool)
        for row in (~clear).nonzero().flatten().tolist():  # near-ties and flat rows: the canonical way
            out[row] = self.head.canonical(x[row])
        self.recomputed += int((~clear).sum())
        self.screened += int(clear.sum())
        return out.view(*lead, -1)

    def screen(self, x: torch.Tensor, norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] fp32 -> (g, r) [V, M]: screened logits and their error bounds (module docstring)."""
        M = x.shape[0]
        if self.product == "dense":
            g = self.kernel(x).T  # [V, M]
            return g, self.kernel_bound[:, None] * norms + 2.0**-20 * g.abs() + 1e-30
        hi = x.to(torch.bfloat16)
        lo = (x - hi.float()).to(torch.bfloat16)
        if self.product == "dot" and 2 * M <= self.dot_columns:
            G = self.kernel.loop(torch.cat([hi, lo]))  # [2M, V] fp32: x_hi rows, then x_lo rows
            g = (G[:M] + G[M:]).T  # [V, M]
            return g, self.dot_bound[:, None] * norms + 2.0**-20 * g.abs() + 1e-30
        G = (self.low @ torch.cat([hi, lo]).T).float()  # [V, 2M]: columns x_hi rows, then x_lo rows
        g = G[:, :M] + G[:, M:]  # [V, M]
        r = ((self.rounding_norm + self.residue * self.row_norm)[:, None] * norms
             + 2.0**-7 * (G[:, :M].abs() + G[:, M:].abs()) + 2.0**-20 * g.abs() + 1e-30)  # [V, M]
        return g, r
