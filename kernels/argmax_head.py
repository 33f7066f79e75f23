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

On AVX2 CPUs without AVX512-BF16 (where torch's bf16 product is slow) the screen is
kernels/dense_cpu.c's product of the same bf16 copy with x in fp32, summed in fp32 (ArgmaxScreen's
bound; 4.5 ms a row against the fp32 head's 6.5-8 ms on a 2-core AMD EPYC, 10 ms against 12-17 for
8 rows, scripts/profile_step.py); the candidates and the near-tie rule are the same.

The rows returned are argmax-only: the candidates' fp32 logits, -inf elsewhere. Only greedy
decoding that displays nothing may use them (LeanModel.argmax_only); sampling and display read
the full head.
"""

from __future__ import annotations

import torch

from . import dense_cpu

U32 = 2.0**-24  # unit roundoff of float32
MAX_CANDIDATES = 256  # more than this (a flat row): the canonical product is as cheap


def screen_supported() -> bool:
    """The bf16 product is fast where the CPU computes bf16 natively (AVX512-BF16) or where
    kernels/dense_cpu.c reads bf16 weights into fp32 products (AVX2 without AVX512-BF16)."""
    return torch.cpu._is_avx512_bf16_supported() or dense_cpu.available()


class ArgmaxScreen:
    """Argmax-exact logits of `head` (a GuardedHead) for rows of hidden states.

    use_kernel: screen with kernels/dense_cpu.c (None: where it serves this CPU). Its product
    g = W_hi @ x keeps x in fp32 and sums in fp32, so its bound is simpler than the bf16 one above:

        |s_v - g_v| <= |dW_v| |x| + gamma_D |W_hi_v| |x|,    |W_hi_v| <= |W_v| + |dW_v|
    """

    def __init__(self, head, use_kernel: bool | None = None) -> None:
        W = head.weight.detach()  # [V, D] fp32
        V, D = W.shape
        self.head = head
        self.low = W.to(torch.bfloat16)  # [V, D]
        self.kernel = dense_cpu.dense(self.low) if use_kernel is not False else None  # shares self.low
        if use_kernel and self.kernel is None:
            raise RuntimeError("kernels/dense_cpu.c does not serve this CPU")
        wide = W.double()
        self.rounding_norm = ((wide - self.low.double()).norm(dim=1) * (1 + 1e-6)).float()  # |dW_v| [V]
        self.row_norm = (wide.norm(dim=1) * (1 + 1e-6)).float()  # |W_v| [V]
        self.gamma = D * U32 / (1 - D * U32)
        self.residue = 2.0**-16 + 2 * self.gamma
        self.eps_per_norm = self.gamma * float(self.row_norm.max()) * (1 + 1e-3)
        self.kernel_bound = self.rounding_norm + self.gamma * (1 + 1e-3) * (self.row_norm + self.rounding_norm)  # [V]
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
        if self.kernel is not None:
            g = self.kernel(x).T  # [V, M]
            return g, self.kernel_bound[:, None] * norms + 2.0**-20 * g.abs() + 1e-30
        hi = x.to(torch.bfloat16)
        lo = (x - hi.float()).to(torch.bfloat16)
        G = (self.low @ torch.cat([hi, lo]).T).float()  # [V, 2M]: columns x_hi rows, then x_lo rows
        g = G[:, :M] + G[:, M:]  # [V, M]
        r = ((self.rounding_norm + self.residue * self.row_norm)[:, None] * norms
             + 2.0**-7 * (G[:, :M].abs() + G[:, M:].abs()) + 2.0**-20 * g.abs() + 1e-30)  # [V, M]
        return g, r
