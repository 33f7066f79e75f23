"""Merge policies: how the trees of several speculators become the one tree the verifier scores.

Every speculator s = 0..S-1 drafts its own tree T_s below the same root r (the newest committed
token). A node is identified by its token path from the root, so T_s is a set of paths closed
under prefixes. For a node u of the union, let

    src(u)   = { s : u in T_s }            (the bitmask TokenTree.sources[u])
    votes(u) = |src(u)|                    (its popcount)

Because every T_s is prefix-closed, src(child) is a subset of src(parent): votes never grow
going down a branch.

union (SpecInfer):   U = T_0 u T_1 u ... u T_{S-1}, shared prefixes merged, source bits OR-ed
                     (each drafter merges its tree into the step's: TokenTree.merge).

vote (Minions' majority vote, per depth): start from U and keep K_0 = {r}; for d = 1, 2, ...

    C_d = { u in U : depth(u) = d, parent(u) in K_{d-1} }      the candidates at depth d
    K_d = { u in C_d : votes(u) = max_{v in C_d} votes(v) }    the best-supported ones, ties kept

    and stop at the first d with C_d empty. The vote tree is V = K_0 u K_1 u ...

Every other node of U is dropped with its subtree (its descendants' parents never survive).
Properties: V is a subtree of U containing the root (every path of V is a path of U) and
|V| <= |U|; where no two speculators agree at a depth (all votes 1) that depth keeps every
candidate, so with a single speculator V = U. The tree is smaller for the same coverage: a
token several speculators agree on is more likely to be the verifier's choice.

Both policies are lossless: greedy acceptance commits the verifier's argmax path whatever the
tree, and multi-step speculative sampling with point-mass proposals keeps the verifier's
distribution for any tree that is a deterministic function of the committed tokens (accept.py).
The policy only changes how many tokens are accepted per verifier step and how big the tree is.
"""

from __future__ import annotations

from .settings import MERGE_POLICIES as POLICIES
from .tree import TokenTree


def vote_tree(tree: TokenTree) -> TokenTree:
    """Keep, depth by depth, the candidates with the most votes (see the module docstring).

    `tree` is a union tree whose `sources` bitmasks say which speculators contain each node; it is
    not modified. The result is a new compact TokenTree (parents before children, the original
    order otherwise) with tokens, sources, draft and verifier probabilities carried over.
    """
    n = len(tree)
    parents, depths, sources = tree.parents, tree.depths, tree.sources
    by_depth: list[list[int]] = [[] for _ in range(max(depths) + 1)] if n else []
    for i in range(1, n):
        by_depth[depths[i]].append(i)
    keep = [False] * n
    if n:
        keep[0] = True
    for nodes in by_depth[1:]:
        candidates = [i for i in nodes if keep[parents[i]]]
        if not candidates:
            break
        votes = [sources[i].bit_count() for i in candidates]
        best = max(votes)
        for i, v in zip(candidates, votes):
            if v == best:
                keep[i] = True
    return tree.select(keep)


def apply_policy(union: TokenTree, policy: str) -> TokenTree:
    """The union tree of all speculators -> the tree to verify under `policy`."""
    if policy == "union":
        return union
    if policy == "vote":
        return vote_tree(union)
    raise ValueError(f"--merge must be one of {', '.join(POLICIES)}, not {policy!r}")

