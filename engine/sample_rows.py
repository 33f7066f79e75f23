"""One draw per row from the verifier's nucleus (top-p) distribution: batched decoding's sampler.

accept.target_probs builds the whole filtered distribution [N, V], which verification needs (it
compares the verifier's and the drafter's probabilities token by token). A sampled answer
(batch_generate.py: `spectui tune`'s answers and Magpie prompts) needs only one token per row, and
a multinomial over target_probs' fp64 rows, all V columns of them, cost more than the draw itself
(with target_probs' old whole sort of every row, about 40 % of a 48-row Magpie round on the 2-core
AMD EPYC).

The draw. With a row's probabilities in descending order and c_i their prefix sums, top-p keeps the
first m (nucleus.py: the rule, and which rows are sorted how far) and renormalises: P(i) = p_(i) / c_m.
For u uniform on [0, c_m), u falls in [c_(i-1), c_i) with exactly that probability, and i - 1 is the
number of prefix sums <= u (inverse CDF; an empty interval, p_(i) = 0, is never hit). Without top-p
(top_p >= 1) the same inverse CDF runs over the unsorted row.

So each row's token has the distribution of multinomial(target_probs(logits, temperature, top_p));
the random stream is used differently (one uniform a row), so a seed gives other draws than that.
"""

from __future__ import annotations

import torch

from .nucleus import sort_for_nucleus


def sample_rows(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [N, V] -> one token id per row [N] (int64), drawn as the module docstring says."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # [N, V]
    N = probs.shape[0]
    u = torch.rand(N, dtype=torch.float64, generator=generator)  # [N], one uniform a row
    if top_p >= 1.0:  # no filter: the inverse CDF over the row as it is
        return draw(probs, torch.cumsum(probs, dim=-1), u, None)
    tokens = torch.empty(N, dtype=torch.long)
    for group in sort_for_nucleus(probs, top_p):
        tokens = group.place(tokens, draw(group.p, group.cumulative, group.of(u), group.order, group.kept(top_p)))
    return tokens


def draw(p: torch.Tensor, cumulative: torch.Tensor, u: torch.Tensor, order: torch.Tensor | None,
         in_nucleus: torch.Tensor | None = None) -> torch.Tensor:
    """p [n, K] (descending when `order` is given), cumulative its prefix sums, u [n] uniform on [0, 1);
    order [n, K]: the token id of each column (None: the columns are the ids); in_nucleus [n, K]: the
    kept columns, a prefix of each row (None: every column) -> token ids [n]."""
    if in_nucleus is None:
        kept = torch.full((p.shape[0],), p.shape[1], dtype=torch.long)  # [n]: every column
    else:
        kept = in_nucleus.sum(dim=-1)  # [n]: m, the nucleus is the first m columns (m >= 1)
    mass = cumulative.gather(-1, (kept - 1)[:, None])  # [n, 1]: c_m
    index = (cumulative <= u[:, None] * mass).sum(dim=-1)  # [n]: prefix sums <= u c_m
    index = torch.minimum(index, kept - 1)  # u c_m rounding onto c_m itself
    return index if order is None else order.gather(-1, index[:, None])[:, 0]
