"""TokenTree: masks and positions against brute force on random trees; merging keeps sources."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectui.engine.tree import TokenTree


@st.composite
def random_trees(draw):
    n = draw(st.integers(1, 40))
    tree = TokenTree.with_root(draw(st.integers(0, 9)))
    for _ in range(n - 1):
        parent = draw(st.integers(0, len(tree) - 1))
        tree.add(parent, draw(st.integers(0, 50)), draw(st.integers(0, 3)), draw(st.floats(0, 1)))
    return tree


def brute_ancestors(tree, i):
    out = {i}
    while tree.parents[i] >= 0:
        i = tree.parents[i]
        out.add(i)
    return out


@settings(max_examples=150, deadline=None)
@given(random_trees(), st.integers(0, 20))
def test_mask_and_positions_match_brute_force(tree, prefix):
    mask = tree.ancestor_mask()
    full = tree.attention_mask(prefix)
    positions = tree.position_ids(prefix).tolist()
    n = len(tree)
    assert full.shape == (1, 1, n, prefix + n)
    assert full[0, 0, :, :prefix].all()
    for i in range(n):
        expected = brute_ancestors(tree, i)
        assert {j for j in range(n) if mask[i, j]} == expected
        assert full[0, 0, i, prefix:].tolist() == mask[i].tolist()
        assert positions[i] == prefix + len(expected) - 1  # depth = number of proper ancestors


@settings(max_examples=150, deadline=None)
@given(random_trees(), st.integers(0, 20))
def test_a_chain_is_exactly_a_causal_pass(tree, prefix):
    """is_chain holds iff the tree's positions and mask are a causal pass's (what score_tree relies on)."""
    n = len(tree)
    causal = tree.position_ids(prefix).tolist() == list(range(prefix, prefix + n)) and bool(
        tree.ancestor_mask().equal(torch.ones(n, n, dtype=torch.bool).tril()))
    assert tree.is_chain == causal


@settings(max_examples=100, deadline=None)
@given(random_trees())
def test_siblings_have_distinct_tokens_and_parents_come_first(tree):
    for i in range(1, len(tree)):
        assert tree.parents[i] < i
        assert tree.depths[i] == tree.depths[tree.parents[i]] + 1
    seen = set()
    for i in range(1, len(tree)):
        key = (tree.parents[i], tree.tokens[i])
        assert key not in seen
        seen.add(key)


def test_merge_unions_shared_prefixes_and_keeps_sources():
    a = TokenTree.with_root(1)
    a.add_path([5, 6, 7], source=0, probs=[0.9, 0.8, 0.7])
    b = TokenTree.with_root(1)
    b.add_path([5, 6, 8], source=1, probs=[0.5, 0.95, 0.4])
    b.add_path([9], source=1)
    a.merge(b)
    paths = {tuple(a.tokens[j] for j in a.path_to(i)) for i in range(1, len(a)) if not a.children(i)}
    assert paths == {(5, 6, 7), (5, 6, 8), (9,)}
    assert len(a) == 6  # root, 5, 6, 7, 8, 9
    five = a.child_with_token(0, 5)
    six = a.child_with_token(five, 6)
    assert a.sources[five] == 0b11 and a.sources[six] == 0b11
    assert a.draft_probs[six] == 0.95
    assert a.sources[a.child_with_token(six, 8)] == 0b10


def test_merge_refuses_other_root():
    a, b = TokenTree.with_root(1), TokenTree.with_root(2)
    try:
        a.merge(b)
    except ValueError:
        return
    raise AssertionError("merging trees with different roots must fail")
