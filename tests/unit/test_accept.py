"""Verification rules: greedy follows argmax; stochastic MSS keeps the target distribution exactly.

The statistical test: a fixed tree with deterministic (top-k) children over a small vocabulary,
a fixed target p, 40,000 draws with a fixed seed. The emitted first token must follow p, and the
second token, given the first was the accepted child, must follow p at that child. Pearson's
chi-square test, p-value > 0.001 (a correct sampler fails this one time in a thousand; the seed
is fixed, so the test is deterministic). A sampler that uses min(1, p/q) with q the SSM softmax
instead of the point mass is biased and fails it (checked below).
"""

import torch
from scipy.stats import chisquare

from spectui.engine.accept import accept_greedy, accept_stochastic, target_probs
from spectui.engine.tree import TokenTree

DRAWS = 40_000


def small_tree():
    tree = TokenTree.with_root(0)
    a = tree.add(0, 3, 0, 0.6)
    tree.add(0, 5, 0, 0.3)
    tree.add(0, 1, 1, 0.2)
    tree.add(a, 2, 0, 0.7)
    tree.add(a, 4, 1, 0.5)
    return tree, a


def test_greedy_follows_argmax_and_returns_bonus():
    tree, a = small_tree()
    logits = torch.full((len(tree), 8), -5.0)
    logits[0, 3] = 5.0  # root -> 3 (node a)
    logits[a, 4] = 5.0  # a -> 4 (a child)
    child4 = tree.child_with_token(a, 4)
    logits[child4, 7] = 5.0  # 4 -> 7: not drafted, so it is the bonus
    accepted, bonus = accept_greedy(tree, logits)
    assert accepted == [a, child4]
    assert bonus == 7


def test_greedy_rejects_everything_when_argmax_is_not_drafted():
    tree, _ = small_tree()
    logits = torch.zeros(len(tree), 8)
    logits[0, 6] = 1.0
    assert accept_greedy(tree, logits) == ([], 6)


def test_top_p_keeps_smallest_set_reaching_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = target_probs(logits, 1.0, 0.75)[0]
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(target_probs(logits, 1.0, 1.0)[0].float(), torch.tensor([0.5, 0.3, 0.15, 0.05]))


def sample_pairs(tree, probs, seed=1234):
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(DRAWS):
        accepted, bonus = accept_stochastic(tree, probs, gen)
        tokens = [tree.tokens[i] for i in accepted] + [bonus]
        pairs.append((tokens[0], tokens[1] if len(tokens) > 1 else None, accepted[:1]))
    return pairs


def chi2_pvalue(observed_tokens, p):
    counts = torch.bincount(torch.tensor(observed_tokens), minlength=len(p)).double()
    keep = p > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    expected = p[keep] * counts.sum()
    return chisquare(counts[keep].numpy(), expected.numpy()).pvalue


def test_mss_matches_target_distribution():
    tree, a = small_tree()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(tree), 8, generator=gen) * 1.5
    logits[0, 3] += 2.0  # make the drafted child a likely, so its subtree is exercised often
    probs = target_probs(logits, 0.8, 0.95)
    pairs = sample_pairs(tree, probs)
    assert chi2_pvalue([first for first, _, _ in pairs], probs[0]) > 1e-3
    # second token given the first was node a's token (3) and a was accepted
    second = [s for first, s, acc in pairs if acc == [a]]
    assert len(second) > 5_000
    assert chi2_pvalue(second, probs[a]) > 1e-3
    # the tree was used: some draws accepted drafted tokens
    assert sum(1 for *_, acc in pairs if acc) > DRAWS * 0.2


def test_naive_ratio_test_would_be_caught():
    """Control: accepting child x with min(1, p/q) for a soft q (wrong for top-k trees) is biased."""
    tree, _ = small_tree()
    probs = target_probs(torch.randn(len(tree), 8, generator=torch.Generator().manual_seed(0)) * 1.5, 0.8, 0.95)
    gen = torch.Generator().manual_seed(99)
    firsts = []
    for _ in range(DRAWS):
        p = probs[0].clone()
        token = None
        for child in tree.children(0):
            x = tree.tokens[child]
            if torch.rand((), generator=gen) < min(1.0, float(p[x]) / tree.draft_probs[child]):
                token = x
                break
        if token is None:
            token = int(torch.multinomial(p, 1, generator=gen))
        firsts.append(token)
    assert chi2_pvalue(firsts, probs[0]) < 1e-3


def test_nucleus_from_the_top_k_prefix_is_the_full_sort_nucleus(monkeypatch):
    """target_probs sorts only the NUCLEUS_PREFIX most likely tokens when they hold top_p of the mass
    (flat rows alone are sorted whole); the kept set and the probabilities are those of a full sort,
    for peaked rows, flat rows and a batch mixing both."""
    import spectui.engine.nucleus as nucleus

    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(6, 5000, generator=g) * scale for scale in (0.3, 3.0, 8.0)]
    batches.append(torch.cat([batches[0][:3], batches[2][:3]]))  # flat rows beside peaked ones
    for logits in batches:
        for top_p in (0.5, 0.95, 0.999):
            monkeypatch.setattr(nucleus, "NUCLEUS_PREFIX", 64)
            prefix = target_probs(logits, 0.8, top_p)
            monkeypatch.setattr(nucleus, "NUCLEUS_PREFIX", 5000)
            full = target_probs(logits, 0.8, top_p)
            assert torch.equal(prefix, full), top_p
            assert torch.allclose(prefix.sum(-1), torch.ones(6, dtype=torch.float64))
