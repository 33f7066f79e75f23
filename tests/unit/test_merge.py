"""Merge policies on hand-built and random trees: union keeps everything, vote keeps, per depth,
the candidates most speculators agree on (engine/merge.py)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectui.engine.merge import apply_policy, vote_tree
from spectui.engine.tree import TokenTree


def union_of(trees: list[TokenTree]) -> TokenTree:
    """The union as a step builds it: each drafter merges its own tree into the step's (TokenTree.merge)."""
    out = TokenTree.with_root(trees[0].tokens[0])
    for tree in trees:
        out.merge(tree)
    return out


def spec(source: int, *paths, probs=None) -> TokenTree:
    """One speculator's tree: chains of tokens below root 1, all with this source bit."""
    tree = TokenTree.with_root(1)
    for path in paths:
        tree.add_path(list(path), source, probs)
    return tree


def paths(tree: TokenTree) -> set[tuple[int, ...]]:
    """Every root-to-node token path (root excluded), so prefixes are included."""
    return {tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(1, len(tree))}


def node(tree: TokenTree, *tokens) -> int:
    at = 0
    for token in tokens:
        at = tree.child_with_token(at, token)
        assert at is not None, f"path {tokens} missing"
    return at


def assert_well_formed(tree: TokenTree) -> None:
    n = len(tree)
    assert len(tree.parents) == len(tree.depths) == len(tree.sources) == len(tree.draft_probs) == n
    assert tree.parents[0] == -1 and tree.depths[0] == 0
    for i in range(1, n):
        assert 0 <= tree.parents[i] < i, "parents must precede children"
        assert tree.depths[i] == tree.depths[tree.parents[i]] + 1


def test_agreement_at_depth_one_drops_minority_siblings_and_their_subtrees():
    a = spec(0, [5, 6, 7], [9, 10])  # speculator 0: A=5 and B=9
    b = spec(1, [5, 8], [11, 12, 13])  # speculator 1: A=5 and C=11
    union = apply_policy(union_of([a, b]), "union")
    assert paths(union) >= {(9, 10), (11, 12, 13)}
    vote = apply_policy(union_of([a, b]), "vote")
    assert_well_formed(vote)
    # depth 1: 5 has 2 votes, 9 and 11 one each -> only 5 survives, with it goes nothing of 9/11
    assert [vote.tokens[c] for c in vote.children(0)] == [5]
    # depth 2: 6 and 8 both have one vote -> both kept (a tie), depth 3 likewise
    assert paths(vote) == {(5,), (5, 6), (5, 8), (5, 6, 7)}
    assert len(vote) == 5 and len(union) == 10


def test_no_agreement_equals_union():
    a = spec(0, [5, 6], [7])
    b = spec(1, [8, 9, 10])
    union = apply_policy(union_of([a, b]), "union")
    vote = apply_policy(union_of([a, b]), "vote")
    assert vote.tokens == union.tokens and vote.parents == union.parents
    assert vote.sources == union.sources and vote.draft_probs == union.draft_probs


def test_single_speculator_vote_is_union():
    a = spec(0, [5, 6, 7], [5, 8], [9])
    vote = apply_policy(union_of([a]), "vote")
    assert paths(vote) == paths(a) and len(vote) == len(a)


def test_three_speculators_two_against_one_at_each_depth():
    a = spec(0, [5, 6, 7])
    b = spec(1, [5, 6, 8])
    c = spec(2, [9, 6, 7])
    vote = apply_policy(union_of([a, b, c]), "vote")
    assert_well_formed(vote)
    # depth 1: 5 (a, b) beats 9 (c); depth 2: 5->6 has 2 votes alone; depth 3: 7 and 8 tie at 1
    assert paths(vote) == {(5,), (5, 6), (5, 6, 7), (5, 6, 8)}
    assert vote.sources[node(vote, 5)] == 0b011
    assert vote.sources[node(vote, 5, 6, 7)] == 0b001
    assert vote.sources[node(vote, 5, 6, 8)] == 0b010


def test_max_is_over_the_whole_depth_not_per_parent():
    a = spec(0, [5, 6], [9, 10])
    b = spec(1, [5, 6], [9, 11])
    c = spec(2, [9, 12])
    vote = apply_policy(union_of([a, b, c]), "vote")
    # depth 1: 9 has 3 votes, 5 has 2 -> 5 and its subtree go; depth 2 under 9: 10, 11, 12 tie
    assert paths(vote) == {(9,), (9, 10), (9, 11), (9, 12)}


def test_depth_by_depth_on_a_deep_majority():
    a = spec(0, [5, 6, 7, 8], [5, 20])
    b = spec(1, [5, 6, 7, 9])
    c = spec(2, [5, 6, 30])
    vote = apply_policy(union_of([a, b, c]), "vote")
    # d1: 5 (3 votes); d2: 6 (3) beats 20 (1); d3: 7 (2) beats 30 (1); d4: 8, 9 tie (1)
    assert paths(vote) == {(5,), (5, 6), (5, 6, 7), (5, 6, 7, 8), (5, 6, 7, 9)}


def test_sources_and_probs_are_preserved_and_input_untouched():
    a = spec(0, [5, 6], [9], probs=[0.9, 0.4])
    b = spec(1, [5, 7], probs=[0.3, 0.8])
    union = union_of([a, b])
    before = (list(union.tokens), list(union.parents), list(union.sources), list(union.draft_probs))
    union.verifier_probs[node(union, 5, 7)] = 0.25
    vote = vote_tree(union)
    assert (union.tokens, union.parents, union.sources, union.draft_probs) == before
    assert paths(vote) == {(5,), (5, 6), (5, 7)}
    five, six, seven = node(vote, 5), node(vote, 5, 6), node(vote, 5, 7)
    assert vote.sources[five] == 0b11 and vote.draft_probs[five] == 0.9  # max over sources
    assert vote.sources[six] == 0b01 and vote.draft_probs[six] == 0.4
    assert vote.sources[seven] == 0b10 and vote.draft_probs[seven] == 0.8
    assert vote.verifier_probs[seven] == 0.25 and vote.verifier_probs[six] is None
    assert vote.tokens[0] == 1 and vote.draft_probs[0] == 1.0


def test_root_only_and_unknown_policy():
    root = TokenTree.with_root(3)
    assert len(vote_tree(root)) == 1 and vote_tree(root).tokens == [3]
    with pytest.raises(ValueError, match="--merge"):
        apply_policy(union_of([root]), "majority")
    with pytest.raises(ValueError, match="--merge"):
        apply_policy(root, "intersection")
    with pytest.raises(ValueError):
        apply_policy(union_of([TokenTree.with_root(1), TokenTree.with_root(2)]), "vote")


@st.composite
def speculator_trees(draw):
    """2 to 4 speculators, each a random tree below root 1 over a tiny vocabulary (so they overlap)."""
    trees = []
    for source in range(draw(st.integers(2, 4))):
        tree = TokenTree.with_root(1)
        for _ in range(draw(st.integers(0, 15))):
            parent = draw(st.integers(0, len(tree) - 1))
            tree.add(parent, draw(st.integers(2, 5)), source, draw(st.floats(0, 1)))
        trees.append(tree)
    return trees


def brute_vote(trees: list[TokenTree]) -> set[tuple[int, ...]]:
    """The definition on path sets: votes(p) = number of speculators holding path p."""
    sets = [paths(t) for t in trees]
    union = set().union(*sets)
    kept, frontier, depth = set(), {()}, 1
    while True:
        candidates = [p for p in union if len(p) == depth and p[:-1] in frontier]
        if not candidates:
            return kept
        votes = {p: sum(p in s for s in sets) for p in candidates}
        best = max(votes.values())
        frontier = {p for p in candidates if votes[p] == best}
        kept |= frontier
        depth += 1


@settings(max_examples=200, deadline=None)
@given(speculator_trees())
def test_vote_is_a_subtree_of_union_and_matches_the_definition(trees):
    union = apply_policy(union_of(trees), "union")
    vote = apply_policy(union_of(trees), "vote")
    assert_well_formed(vote)
    assert len(vote) <= len(union)
    assert paths(vote) <= paths(union)  # every vote path is a union path
    assert paths(vote) == brute_vote(trees)
    assert paths(union) == set().union(*(paths(t) for t in trees))
    for i in range(1, len(vote)):
        u = node(union, *[vote.tokens[j] for j in vote.path_to(i)])
        assert vote.sources[i] == union.sources[u] and vote.draft_probs[i] == union.draft_probs[u]
    by_depth: dict[int, set[int]] = {}
    for i in range(1, len(vote)):
        by_depth.setdefault(vote.depths[i], set()).add(vote.sources[i].bit_count())
    assert all(len(counts) == 1 for counts in by_depth.values()), "one vote count per depth survives"
    siblings = [(vote.parents[i], vote.tokens[i]) for i in range(1, len(vote))]
    assert len(siblings) == len(set(siblings))
