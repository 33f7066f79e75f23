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

For display (GenerationSettings.detail) the caller may pass a SamplingLog: it records each test's
uniform draw u and acceptance probability min(1, p'(x)/q(x)) = p'(x) (p' the residual at that
point, q the point mass), and the residual the bonus token was drawn from. Without one nothing is
recorded; with one the draws and decisions are the same (tests/unit/test_accept.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .events import ResidualToken, SampleTest, Sampling
from .nucleus import sort_for_nucleus
from .tree import TokenTree

RESIDUAL_TOP = 5  # a SamplingLog keeps this many of the residual's most likely tokens


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Verifier distributions [N, V] (fp64) at this temperature, with nucleus (top-p) filtering
    (nucleus.py: the rule, and which rows are sorted how far)."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # [N, V]
    if top_p < 1.0:
        keep = torch.zeros_like(probs, dtype=torch.bool)  # [N, V]: columns past a row's sorted prefix are dropped
        for group in sort_for_nucleus(probs, top_p):
            kept = torch.zeros(group.p.shape[0], probs.shape[-1], dtype=torch.bool)  # [n, V]
            keep = group.place(keep, kept.scatter_(-1, group.order, group.kept(top_p)))
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def ordered_children(tree: TokenTree, node: int) -> list[int]:
    return sorted(tree.children(node), key=lambda c: -tree.draft_probs[c])


def accept_greedy(tree: TokenTree, logits: torch.Tensor, best: list[int] | None = None) -> tuple[list[int], int]:
    """logits [N, V] of the tree nodes -> (accepted node ids, bonus token). best: each row's argmax where the
    caller has it already (the verifier's argmax screen)."""
    best = logits.argmax(dim=-1).tolist() if best is None else best  # [N]
    node, accepted = 0, []
    while True:
        nxt = tree.child_with_token(node, best[node])
        if nxt is None:
            return accepted, best[node]
        accepted.append(nxt)
        node = nxt


@dataclass
class SamplingLog:
    """The numbers one accept_stochastic call used, in the order it used them (for display)."""

    tests: list[tuple[int, float, float, bool]] = field(default_factory=list)  # (node, u, p'(x), accepted)
    bonus_node: int = 0  # where the bonus token was drawn: the last accepted node (0: the root)
    removed_mass: float = 0.0  # the target mass of the children rejected there
    bonus_prob: float = 0.0  # the bonus token's probability in the residual it was drawn from
    top: list[tuple[int, float]] = field(default_factory=list)  # that residual's most likely tokens

    def drew(self, node: int, target: torch.Tensor, left: torch.Tensor, bonus: int) -> None:
        """target [V] the node's distribution; left [V] what the rejections left of it (the residual
        before normalising), which the bonus token was drawn from."""
        residual = left / left.sum()
        values, tokens = torch.topk(residual, min(RESIDUAL_TOP, residual.shape[-1]))
        self.bonus_node, self.bonus_prob = node, float(residual[bonus])
        self.removed_mass = float(target.sum() - left.sum())
        self.top = [(int(t), float(v)) for t, v in zip(tokens, values) if v > 0]

    def describe(self, token_text) -> Sampling:
        """As the StepEvent carries it; token_text(token id) -> its text."""
        return Sampling(
            tests=[SampleTest(node, draw, prob, accepted) for node, draw, prob, accepted in self.tests],
            bonus_node=self.bonus_node,
            removed_mass=self.removed_mass,
            bonus_prob=self.bonus_prob,
            residual_top=[ResidualToken(token, token_text(token), prob) for token, prob in self.top],
        )


def accept_stochastic(
    tree: TokenTree, probs: torch.Tensor, generator: torch.Generator, log: SamplingLog | None = None
) -> tuple[list[int], int]:
    """probs [N, V] target distributions of the tree nodes -> (accepted node ids, bonus token).

    The residual is kept as the node's target p and the tokens removed from it: its mass is
    sum(p) (float64) minus theirs, so a test reads one entry of p, and only the bonus draw touches
    the whole vocabulary."""
    node, accepted = 0, []
    while True:
        p = probs[node]  # [V] the target at this node
        mass = float(p.sum(dtype=torch.float64))  # the residual's mass
        removed: list[int] = []  # tokens of the children rejected here (the residual is p without them)
        descended = False
        for child in ordered_children(tree, node):
            token = tree.tokens[child]
            if mass <= 0:
                break
            p_token = 0.0 if token in removed else float(p[token])
            # q = delta(token): accept with p(token) / (remaining mass), else remove it
            draw = float(torch.rand((), generator=generator, dtype=torch.float64))
            taken = draw * mass < p_token
            if log is not None:
                log.tests.append((child, draw, p_token / mass, taken))
            if taken:
                accepted.append(child)
                node, descended = child, True
                break
            removed.append(token)
            mass -= p_token
        if not descended:
            left = p
            if removed:
                left = p.clone()
                left[removed] = 0.0
                if float(left.sum()) <= 0:  # float dust: every supported token was a rejected child
                    left = p
            bonus = sample_token(left, generator)
            if log is not None:
                log.drew(node, p, left, bonus)
            return accepted, bonus


def sample_token(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from the distribution proportional to weights [V] (>= 0, not all 0), by inverse CDF:
    with c the float64 cumulative sum and u uniform in [0, c[-1]), the first i with c[i] > u, so
    P(i) = (c[i] - c[i-1]) / c[-1] = w_i / sum(w), and a zero weight is never drawn (c does not rise
    there). One uniform and a binary search: torch.multinomial costs ~2 ms over a 49k vocabulary."""
    cdf = torch.cumsum(weights, 0, dtype=torch.float64)  # [V]
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cdf[-1]  # [1]
    i = int(torch.searchsorted(cdf, u, right=True))
    if i >= len(weights) or weights[i] <= 0:  # u rounded up to the total: the last token with weight
        i = int(torch.nonzero(weights > 0)[-1])
    return i
