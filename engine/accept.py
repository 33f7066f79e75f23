"""Verification: which branch of the token tree the verifier accepts, and its bonus token.

Greedy: from the root, follow the child whose token equals the verifier's argmax at its
parent; stop where none does. The argmax at the last accepted node is the bonus token. The
committed tokens are exactly what greedy incremental decoding would produce.

Stochastic: SpecInfer's multi-step speculative sampling (MSS). At node u with verifier
distribution p (after temperature and top-p) and children c_1..c_k proposed with draft
distributions q_1..q_k:

    for each child c_i (token x_i):
        accept c_i with probability min(1, p(x_i) / q_i(x_i))    -> descend into c_i
        otherwise p <- normalise(max(p - q_i, 0))                 (the residual)
    no child accepted: the bonus token is sampled from the final residual p.

Our drafters propose top-k children deterministically, so q_i = delta(x_i). Then the test
accepts x_i with probability p(x_i) and the residual is p with x_i removed, renormalised. The
probability of emitting any token y is exactly p(y): for a child, the product of the previous
rejections (1 - p(x_1))(1 - p(x_2)/(1 - p(x_1)))... times p(x_i)/(remaining mass) telescopes to
p(x_i); for a non-child, the residual mass times its renormalised share is p(y). So top-k trees
keep the verifier's distribution exactly (what the naive min(1, p/q) with q = SSM softmax would
not). tests/unit/test_accept.py checks this with a chi-square test over many draws.
"""

from __future__ import annotations

import torch

from .tree import TokenTree


NUCLEUS_PREFIX = 1024  # top-p looks at the K most likely tokens first (a full sort of 49k costs ~8 ms a row)


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Verifier distributions [N, V] (fp64) at this temperature, with nucleus (top-p) filtering.

    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (at least one):
    token i of the descending order is dropped when the mass before it, c_i - p_i, reaches top_p.
    When the K most likely tokens already hold top_p of the mass (c_K >= top_p), every token after
    them is dropped, so only they need sorting: topk(K) gives them in the order a full sort gives
    (equal probabilities aside, whose order neither fixes), the same prefix sums, the same kept set.
    """
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # [N, V]
    if top_p < 1.0:
        k = min(NUCLEUS_PREFIX, probs.shape[-1])
        sorted_p, order = torch.topk(probs, k, dim=-1)  # [N, K], descending
        cumulative = torch.cumsum(sorted_p, dim=-1)
        if not bool((cumulative[:, -1] >= top_p).all()):  # a flat row: its nucleus may go past K
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            cumulative = torch.cumsum(sorted_p, dim=-1)
        drop_sorted = cumulative - sorted_p >= top_p  # mass of strictly likelier tokens reaches top_p
        drop = torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, drop_sorted)  # unsorted: dropped
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def ordered_children(tree: TokenTree, node: int) -> list[int]:
    return sorted(tree.children(node), key=lambda c: -tree.draft_probs[c])


def accept_greedy(tree: TokenTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """logits [N, V] of the tree nodes -> (accepted node ids, bonus token)."""
    best = logits.argmax(dim=-1).tolist()  # [N]
    node, accepted = 0, []
    while True:
        nxt = tree.child_with_token(node, best[node])
        if nxt is None:
            return accepted, best[node]
        accepted.append(nxt)
        node = nxt


def accept_stochastic(tree: TokenTree, probs: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """probs [N, V] target distributions of the tree nodes -> (accepted node ids, bonus token)."""
    node, accepted = 0, []
    while True:
        p = probs[node].clone()  # [V] the residual, starts as the target
        descended = False
        for child in ordered_children(tree, node):
            token = tree.tokens[child]
            mass = p.sum()
            if mass <= 0:
                break
            # q = delta(token): accept with p(token) / (remaining mass), else remove it
            if torch.rand((), generator=generator, dtype=torch.float64) * mass < p[token]:
                accepted.append(child)
                node, descended = child, True
                break
            p[token] = 0.0
        if not descended:
            if p.sum() <= 0:  # float dust: every supported token was a rejected child
                p = probs[node]
            return accepted, sample_token(p / p.sum(), generator)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a [V] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))
