"""The n-gram (prompt lookup) drafter proposes what followed the longest matching suffix."""

from spectui.engine.drafters import NGramDrafter
from spectui.engine.tree import TokenTree


def test_longest_suffix_wins_and_most_recent_first():
    d = NGramDrafter(max_ngram=3, depth=3, branches=2)
    history = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    # suffix (1, 2, 3) occurred at the start, followed by 4, 9, 2
    assert d.propose(history) == [[4, 9, 2]]
    d2 = NGramDrafter(max_ngram=2, depth=2, branches=2)
    # suffix (2, 3): most recent earlier occurrence at index 5 -> (5, 6), then index 1 -> (4, 9)
    assert d2.propose(history) == [[5, 6], [4, 9]]


def test_no_match_proposes_nothing_and_tree_keeps_only_root():
    d = NGramDrafter()
    tree = TokenTree.with_root(42)
    d.draft([1, 2, 3, 42], tree, source=0, shape=(2, 2))
    assert d.propose([1, 2, 3, 42]) == []
    assert len(tree) == 1


def test_draft_adds_chains_below_root_with_source_bit():
    d = NGramDrafter(max_ngram=2, depth=2, branches=2)
    history = [7, 8, 1, 7, 8]
    tree = TokenTree.with_root(8)
    d.draft(history, tree, source=2, shape=(1,))
    assert tree.tokens[1:] == [1, 7]
    assert tree.parents[1:] == [0, 1]
    assert all(s == 1 << 2 for s in tree.sources[1:])


def test_matches_rank_longest_suffix_first_with_its_length():
    drafter = NGramDrafter()
    #            0  1  2  3  4  5  6  7  8  9 10 11
    committed = [5, 1, 2, 3, 9, 8, 2, 3, 7, 7, 1, 2, 3]  # the suffix 1 2 3 occurred at 1..3, 2 3 at 6..7
    found = drafter.matches(committed, depth=3, branches=2)
    assert found[0] == ([9, 8, 2], 3)  # after the 3-token match
    assert found[1] == ([7, 7, 1], 2)  # after the 2-token match
    assert drafter.matches(committed, depth=3, branches=1) == [found[0]]


def test_matches_need_min_match_and_an_earlier_occurrence():
    drafter = NGramDrafter(min_match=2)
    assert drafter.matches([4, 5, 6]) == []
    assert drafter.matches([1, 4, 2, 4]) == []  # a single-token match is below min_match
    tree = TokenTree.with_root(4)
    drafter.draft_matches([1, 4, 2, 1, 4], tree, 0)
    assert tree.tokens[1:] == [2, 1, 4] and tree.evidence[1] == {0: 2}


def test_the_adaptive_tree_takes_single_token_matches_and_fixed_trees_do_not():
    drafter = NGramDrafter()  # min_match 1 (matches, the auto tree), min_ngram 2 (propose, fixed trees)
    committed = [9, 4, 2, 7, 3, 4]  # the newest token, 4, came before once, after 9 (not after 3)
    assert drafter.matches(committed, depth=3) == [([2, 7, 3], 1)]
    assert drafter.propose(committed) == []
    tree = TokenTree.with_root(4)
    drafter.draft_matches(committed, tree, 0)
    assert tree.tokens[1:] == [2, 7, 3, 4] and tree.evidence[1] == {0: 1}  # to the end; a 1-token match's bin
    # a longer match still comes first, then the most recent single-token one with another first token
    longer = [5, 4, 8, 6, 3, 4, 1, 3, 4]  # "3 4" at 4..5 (followed by 1), "4" alone at 1 (followed by 8)
    assert drafter.matches(longer, depth=2) == [([1, 3], 2), ([8, 6], 1)]


def test_continuations_stop_before_a_boundary_token():
    # an answer repeating the end of the question: what followed there is the chat template's turn markers
    END, START = 2, 1
    question = [START, 50, 60, 70, 71, END, 10, START, 80, 10]
    cut = NGramDrafter(boundary=frozenset({START, END}))
    whole = NGramDrafter()
    answer = question + [60, 70]
    assert whole.matches(answer, depth=6) == [([71, END, 10, START, 80, 10], 2)]
    assert cut.matches(answer, depth=6) == [([71], 2)]
    assert cut.propose(answer) == [[71]]
    assert cut.matches(question + [60, 70, 71]) == []  # a continuation that is all boundary is no draft
    assert cut.propose(question + [60, 70, 71]) == []
