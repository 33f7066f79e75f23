"""Top-p (nucleus) filtering's one rule, shared by verification (accept.target_probs) and batched
sampling (sample_rows.sample_rows).

Let p_(1) >= p_(2) >= ... be a row's probabilities in descending order and c_i their prefix sums.
Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (at least one): token i
of the descending order is kept while the mass before it, c_i - p_(i), is below top_p.

Only the kept tokens need sorting. When the NUCLEUS_PREFIX most likely tokens already hold top_p
(c_K >= top_p), every token after them is dropped, and torch.topk gives them in the order a full
sort gives (equal probabilities aside, whose order neither fixes): the same prefix sums, the same
kept set. A flat row, whose K most likely hold less, is sorted whole; those rows alone, since a
full sort of 49k columns costs ~8 ms a row here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUCLEUS_PREFIX = 1024  # K: the most likely tokens looked at first


@dataclass
class SortedRows:
    """Some rows of a [N, V] distribution in descending order, far enough to hold their nuclei."""
    rows: torch.Tensor | None  # [N] bool: which rows these are (None: all of them)
    p: torch.Tensor  # [n, K'] descending (K' = K, or V for flat rows)
    order: torch.Tensor  # [n, K']: each column's token id
    cumulative: torch.Tensor  # [n, K']: prefix sums of p

    def kept(self, top_p: float) -> torch.Tensor:
        """[n, K'] bool: in the nucleus (the rule above)."""
        return self.cumulative - self.p < top_p

    def of(self, x: torch.Tensor) -> torch.Tensor:
        """These rows of x [N, ...] -> [n, ...]."""
        return x if self.rows is None else x[self.rows]

    def place(self, out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """out [N, ...] with these rows set to values [n, ...] (values itself when these are all the rows)."""
        return values if self.rows is None else out.index_put_((self.rows,), values)


def sort_for_nucleus(probs: torch.Tensor, top_p: float) -> list[SortedRows]:
    """probs [N, V] -> one SortedRows for every row (the K-prefix for most, a whole sort for flat rows)."""
    sorted_p, order = torch.topk(probs, min(NUCLEUS_PREFIX, probs.shape[-1]), dim=-1)  # [N, K], descending
    cumulative = torch.cumsum(sorted_p, dim=-1)  # [N, K]
    flat = cumulative[:, -1] < top_p  # [N]: the nucleus may go past K
    if not bool(flat.any()):
        return [SortedRows(None, sorted_p, order, cumulative)]
    groups = []
    short = ~flat
    if bool(short.any()):
        groups.append(SortedRows(short, sorted_p[short], order[short], cumulative[short]))
    whole_p, whole_order = torch.sort(probs[flat], dim=-1, descending=True)  # [n, V]
    groups.append(SortedRows(flat, whole_p, whole_order, torch.cumsum(whole_p, dim=-1)))
    return groups
