"""SamplingLog: what accept_stochastic records for display (step mode's sampling test).

The log must not change the sampler (same seed: same branches and bonus tokens with and without
it), and every number in it must be the one the test used, recomputed here independently from
the target distributions: each child's acceptance probability p(x) / (mass left at its parent),
the decision u < that probability, the children tried in the engine's order, and the residual the
bonus token was drawn from (its removed mass, the bonus token's share, its most likely tokens).
"""

import torch

from spectui.engine.accept import RESIDUAL_TOP, SamplingLog, accept_stochastic, ordered_children, target_probs
from spectui.engine.tree import TokenTree

VOCAB = 12


def random_tree(seed: int) -> TokenTree:
    """Two or three children at the root and one level below each, with distinct draft probs."""
    g = torch.Generator().manual_seed(seed)
    tree = TokenTree.with_root(0)
    tokens = torch.randperm(VOCAB, generator=g).tolist()
    for k, token in enumerate(tokens[: 2 + seed % 2]):
        child = tree.add(0, token, k % 2, 0.9 - 0.2 * k)
        for j, below in enumerate(torch.randperm(VOCAB, generator=g)[:2].tolist()):
            tree.add(child, below, 0, 0.5 - 0.1 * j)
    return tree


def sampled(tree, probs, seed, with_log):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(200):
        log = SamplingLog() if with_log else None
        out.append((accept_stochastic(tree, probs, g, log), log))
    return out


def test_the_log_changes_no_draw():
    for seed in range(4):
        tree = random_tree(seed)
        probs = target_probs(torch.randn(len(tree), VOCAB, generator=torch.Generator().manual_seed(seed)) * 2, 0.8, 0.95)
        plain = [result for result, _ in sampled(tree, probs, seed, False)]
        logged = [result for result, _ in sampled(tree, probs, seed, True)]
        assert plain == logged


def test_every_number_is_the_one_the_test_used():
    seen_accept = seen_reject = seen_removed = 0
    for seed in range(6):
        tree = random_tree(seed)
        probs = target_probs(torch.randn(len(tree), VOCAB, generator=torch.Generator().manual_seed(seed)) * 2, 0.8, 1.0)
        for (accepted, bonus), log in sampled(tree, probs, 100 + seed, True):
            node, path, tried = 0, [], iter(log.tests)  # walk the test as the engine does, from the log's draws
            while True:
                children = ordered_children(tree, node)
                left, removed, moved = float(probs[node].sum()), 0.0, False
                for child in children:
                    test_node, draw, accept_prob, taken = next(tried)
                    assert test_node == child  # tried in the engine's order: by draft probability
                    p = float(probs[node, tree.tokens[child]])
                    assert abs(accept_prob - p / left) < 1e-12
                    assert 0.0 <= draw < 1.0 and taken == (draw < accept_prob)
                    if taken:
                        path.append(child)
                        node, moved = child, True
                        seen_accept += 1
                        break
                    left -= p
                    removed += p
                    seen_reject += 1
                if not moved:
                    break
            assert next(tried, None) is None  # nothing recorded that was not tried
            assert path == accepted
            assert log.bonus_node == node
            assert abs(log.removed_mass - removed) < 1e-12
            rejected = {tree.tokens[c] for c in ordered_children(tree, node)}
            residual = probs[node].clone()
            residual[list(rejected)] = 0
            residual /= residual.sum()
            assert abs(log.bonus_prob - float(residual[bonus])) < 1e-12 and log.bonus_prob > 0
            top = torch.topk(residual, RESIDUAL_TOP)
            assert [t for t, _ in log.top] == top.indices.tolist()[: len(log.top)]
            assert all(abs(v - float(top.values[i])) < 1e-12 for i, (_, v) in enumerate(log.top))
            seen_removed += removed > 0
    assert seen_accept > 100 and seen_reject > 100 and seen_removed > 50  # every branch of the test exercised


def test_describe_gives_the_events_fields_with_token_text():
    tree = random_tree(1)
    probs = target_probs(torch.randn(len(tree), VOCAB, generator=torch.Generator().manual_seed(1)), 1.0, 1.0)
    log = SamplingLog()
    accept_stochastic(tree, probs, torch.Generator().manual_seed(5), log)
    sampling = log.describe(lambda token: f"<{token}>")
    assert [(t.node, t.draw, t.accept_prob, t.accepted) for t in sampling.tests] == log.tests
    assert [(r.token_id, r.prob) for r in sampling.residual_top] == log.top
    assert [r.text for r in sampling.residual_top] == [f"<{t}>" for t, _ in log.top]
    assert (sampling.bonus_node, sampling.removed_mass, sampling.bonus_prob) == (log.bonus_node, log.removed_mass, log.bonus_prob)
