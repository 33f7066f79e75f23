"""One draw per row from the verifier's nucleus (top-p) distribution: batched decoding's sampler.

accept.target_probs builds the whole filtered distribution [N, V], which verification needs (it
compares the verifier's and the drafter's probabilities token by token). A sampled answer
(batch_generate.py: `spectui tune`'s answers and Magpie prompts) needs only one token per row, and
target_probs' fp64 rows cost more than the draw: a full sort for a batch with any flat row, then a
multinomial over all V columns (about 40 % of a 48-row Magpie round on the 2-core AMD EPYC).

The draw. Let p_(1) >= p_(2) >= ... be a row's probabilities in descending order, c_i their prefix
sums. Top-p keeps the first m, those with c_i - p_(i) < top_p (target_probs' rule), and renormalises:
P(i) = p_(i) / c_m. For u uniform on [0, c_m), u falls in [c_(i-1), c_i) with exactly that
probability, and i - 1 is the number of prefix sums <= u (inverse CDF; an empty interval, p_(i) = 0,
is never hit). Only the kept tokens need sorting: when the NUCLEUS_PREFIX most likely (torch.topk, in
a full sort's order, equal probabilities aside) already hold top_p of the mass, m lies among them;
rows where they do not are sorted whole, those rows alone. Without top-p (top_p >= 1) the same
inverse CDF runs over the unsorted row.

So each row's token has the distribution of multinomial(target_probs(logits, temperature, top_p));
the random stream is used differently (one uniform a row), so a seed gives other draws than that.
"""

from __future__ import annotations

import torch

from .accept import NUCLEUS_PREFIX


def sample_rows(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [N, V] -> one token id per row [N] (int64), drawn as the module docstring says."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # [N, V]
    N, V = probs.shape
    u = torch.rand(N, dtype=torch.float64, generator=generator)  # [N], one uniform a row
    if top_p >= 1.0:  # no filter: the inverse CDF over the row as it is
        return draw(probs, torch.cumsum(probs, dim=-1), u, None)
    sorted_p, order = torch.topk(probs, min(NUCLEUS_PREFIX, V), dim=-1)  # [N, K], descending
    cumulative = torch.cumsum(sorted_p, dim=-1)  # [N, K]
    flat = cumulative[:, -1] < top_p  # [N]: the nucleus may go past K
    tokens = torch.empty(N, dtype=torch.long)
    short = ~flat
    if bool(short.any()):
        tokens[short] = draw(sorted_p[short], cumulative[short], u[short], order[short], top_p)
    if bool(flat.any()):
        whole_p, whole_order = torch.sort(probs[flat], dim=-1, descending=True)  # [n, V]
        tokens[flat] = draw(whole_p, torch.cumsum(whole_p, dim=-1), u[flat], whole_order, top_p)
    return tokens


def draw(p: torch.Tensor, cumulative: torch.Tensor, u: torch.Tensor, order: torch.Tensor | None,
         top_p: float = 1.0) -> torch.Tensor:
    """p [n, K] (descending when `order` is given), cumulative its prefix sums, u [n] uniform on [0, 1);
    order [n, K]: the token id of each column (None: the columns are the ids) -> token ids [n]."""
    if order is None:
        kept = torch.full((p.shape[0],), p.shape[1], dtype=torch.long)  # [n]: every column
    else:
        kept = (cumulative - p < top_p).sum(dim=-1)  # [n]: m, the nucleus is the first m columns (m >= 1)
    mass = cumulative.gather(-1, (kept - 1)[:, None])  # [n, 1]: c_m
    index = (cumulative <= u[:, None] * mass).sum(dim=-1)  # [n]: prefix sums <= u c_m
    index = torch.minimum(index, kept - 1)  # u c_m rounding onto c_m itself
    return index if order is None else order.gather(-1, index[:, None])[:, 0]
