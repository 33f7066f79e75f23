"""The adaptive tree's choice (auto_tree.select_nodes) against brute force, on random trees.

Properties: the chosen nodes form a tree (closed under ancestors, root kept); its surplus
E[tokens] - R * c_verify(T) is the best over every ancestor-closed subset (so in particular
never below the root alone: never worse than T = 1 in expectation under the model); and the
node budget holds.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectui.engine.auto_tree import node_values, select_nodes
from spectui.engine.tree import TokenTree


def judged(auto, name: str, runs: int, tokens: int, verify_ms: float = 0.0) -> float:
    """Give `name` this answer's record (runs, credited tokens, verify ms its nodes added) -> its gain."""
    r = auto.record(name)
    r.runs, r.tokens, r.verify_ms = runs, tokens, verify_ms
    return auto.gain(name)


def random_tree(parents_seed: list[int], accepts: list[float]) -> tuple[TokenTree, list[float]]:
    tree = TokenTree.with_root(0)
    for i, seed in enumerate(parents_seed, 1):
        tree._append(100 + i, seed % i, 0, 1, 1.0)
        tree.depths[-1] = tree.depths[tree.parents[-1]] + 1
    values = node_values(tree, lambda i: accepts[i - 1])
    return tree, values


def concave_cost(base: float, slope: float):
    return lambda size: base + slope * (size - 1) ** 0.7


def surplus(tree, values, keep, rate, cost) -> float:
    return 1 + sum(v for i, v in enumerate(values) if keep[i] and i) - rate * cost(sum(keep))


trees = st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 1000), min_size=n, max_size=n),
    st.lists(st.floats(0.01, 0.99), min_size=n, max_size=n),
))


@settings(max_examples=150, deadline=None)
@given(trees, st.floats(20, 100), st.floats(0.5, 20), st.floats(0.5, 3.0))
def test_choice_is_the_best_subtree_and_never_worse_than_one_token(data, base, slope, boost):
    tree, values = random_tree(*data)
    cost = concave_cost(base, slope)
    rate = boost / cost(1)  # R at or above an incremental step's rate
    plan = select_nodes(tree, values, cost, rate)
    assert plan.keep[0]
    assert all(not plan.keep[i] or plan.keep[tree.parents[i]] for i in range(1, len(tree)))
    best = max(
        surplus(tree, values, keep, rate, cost)
        for bits in itertools.product([False, True], repeat=len(tree) - 1)
        for keep in [[True, *bits]]
        if all(not keep[i] or keep[tree.parents[i]] for i in range(1, len(tree)))
    )
    chosen = surplus(tree, values, plan.keep, rate, cost)
    assert chosen >= best - 1e-9
    assert chosen >= 1 - rate * cost(1) - 1e-12  # the root alone is always a candidate
    assert abs(plan.expected_tokens - (1 + sum(v for i, v in enumerate(values) if i and plan.keep[i]))) < 1e-9


def test_node_budget_and_obvious_choices():
    tree = TokenTree.with_root(0)
    tree.add_path(list(range(1, 40)), 0)
    cost = concave_cost(50, 2)
    sure = node_values(tree, lambda i: 0.999)
    assert select_nodes(tree, sure, cost, 1 / cost(1), budget=8).size == 8
    hopeless = node_values(tree, lambda i: 0.01)
    assert select_nodes(tree, hopeless, cost, 1 / cost(1)).size == 1  # decode one token


def test_saved_acceptance_is_capped_and_ignores_strangers(tmp_path):
    from spectui.engine.acceptance_model import REMEMBERED, AcceptanceModel

    model = AcceptanceModel(kinds={"ssm": "model", "ngram": "ngram"})
    for k in range(1000):
        model.observe({"ssm": 7}, 1, accepted=k % 4 != 0)  # 75 % accepted, 1000 trials
    model.observe({"ngram": 3}, 2, accepted=True)
    model.observe({"ssm": 7}, 1, accepted=False, contested=True)  # a cell of its own
    model.save(tmp_path / "a.json")
    fresh = AcceptanceModel(kinds={"ssm": "model"})  # the n-gram drafter is gone from this engine
    assert fresh.load(tmp_path / "a.json")
    cell = fresh.cell("ssm", 1, 7)
    assert cell.trials == REMEMBERED and cell.hits == 0.75 * REMEMBERED  # the rate kept, the weight capped
    assert fresh.cell("ssm", 1, 7, contested=True).trials == 1 and fresh.cell("ssm", 1, 7, True).hits == 0
    assert all(s == "ssm" for s, _, _, _ in fresh.cells)
    hits, trials = 0.75 * REMEMBERED, REMEMBERED + 1  # the depth's mean reads the capped cells, both of them
    assert fresh.mean_for("ssm", 1) == pytest.approx((hits + 4 * fresh.prior("ssm", 9)) / (trials + 4))
    (tmp_path / "v1.json").write_text('{"version": 1, "cells": [["ssm", 0, 7, 30, 40]]}', encoding="utf-8")
    older = AcceptanceModel(kinds={"ssm": "model"})  # a file saved before contested cells: read as uncontested
    assert older.load(tmp_path / "v1.json") and older.cell("ssm", 1, 7).trials == 40 and len(older.cells) == 1
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    assert not AcceptanceModel(kinds={"ssm": "model"}).load(tmp_path / "bad.json")


def test_an_ssm_that_does_not_pay_explores_within_its_time_share():
    """An SSM whose drafts are not accepted still drafts now and then (a copying phase may start),
    but its idle interval n keeps n * c_verify(1) * EXPLORE_SHARE >= its draft cost."""
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import EXPLORE_SHARE, MIN_EXPLORE_EVERY, AutoDrafting
    from spectui.engine.costs import CostModel

    for c1, draft_ms in ((10.0, 2.4), (60.0, 2.4)):  # a fast verifier next to its SSM, then a slow one
        costs = CostModel({1: c1, 2: c1 * 1.2}, draft_ms={"ssm": draft_ms})
        auto = AutoDrafting(costs, AcceptanceModel(kinds={"ssm": "model"}))
        assert judged(auto, "ssm", 10**6, 0) < 1e-5
        runs = [step for step in range(1, 200) if auto.worth_running("ssm")]
        gaps = {b - a for a, b in zip(runs, runs[1:])}
        expected = max(MIN_EXPLORE_EVERY, -(-draft_ms // (EXPLORE_SHARE * c1)))
        assert gaps == {int(expected)}, (c1, gaps)
        assert draft_ms / (expected * c1) <= EXPLORE_SHARE or expected == MIN_EXPLORE_EVERY


def test_an_ssm_is_judged_by_what_its_runs_cost_catch_up_included_when_exploring():
    """An SSM runs for its gain only while that beats what its steady runs cost in this answer (all
    their forwards, after PRIOR_RUNS runs at one forward's cost), and its exploring runs, catch-up of
    the idle steps included, stay within EXPLORE_SHARE."""
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import EXPLORE_SHARE, MIN_EXPLORE_EVERY, PRIOR_RUNS, AutoDrafting
    from spectui.engine.costs import CostModel

    c1 = 8.0
    costs = CostModel({1: c1, 2: c1}, draft_ms={"ssm": 1.0})  # a free node: only drafting is judged
    auto = AutoDrafting(costs, AcceptanceModel(kinds={"ssm": "model"}))
    assert judged(auto, "ssm", 24, 4) == 0.25
    assert auto.worth_running("ssm") == "pays"  # 0.25 tokens x 8 ms beat one 1 ms forward ...
    auto.observe_run("ssm", "pays", 30.0, steady=False)  # (a long catch-up is not a steady run)
    assert auto.run_cost("ssm") == 1.0
    steady = 0
    while auto.worth_running("ssm") == "pays":  # ... but a steady run takes three
        auto.observe_run("ssm", "pays", 3.0, steady=True)
        steady += 1
    assert steady == PRIOR_RUNS  # (3 k + 8) / (k + 8) reaches the 2 ms of tokens at k = 8
    assert auto.run_cost("ssm") == (3.0 * steady + PRIOR_RUNS * 1.0) / (steady + PRIOR_RUNS)
    auto.observe_run("ssm", "explore", 9.0, steady=False)  # an exploring run, catch-up and all
    judged(auto, "ssm", 10**6, 0)
    auto.idle["ssm"] = 0
    runs = [step for step in range(1, 400) if auto.worth_running("ssm") == "explore"]
    gaps = {b - a for a, b in zip(runs, runs[1:])}
    expected = math.ceil(max(MIN_EXPLORE_EVERY, 9.0 / (EXPLORE_SHARE * c1)))  # 75 steps, where 1 ms a forward gives 9
    assert gaps == {expected} and expected >= 70 and 9.0 / (expected * c1) <= EXPLORE_SHARE


def test_a_dear_answer_does_not_keep_an_ssm_idle_in_the_next():
    """Run costs are this answer's, as the gain is: deep 9 ms runs on one prompt made the head too dear
    for the next one, and a cost carried over froze while it sat idle (it only changed when it ran)."""
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import AutoDrafting
    from spectui.engine.costs import CostModel

    costs = CostModel({1: 10.0, 2: 10.0}, draft_ms={"ssm": 2.0})
    auto = AutoDrafting(costs, AcceptanceModel(kinds={"ssm": "model"}))
    for _ in range(40):  # a prompt where every run drafts deep: 9 ms, for 0.5 tokens a run
        auto.observe_run("ssm", "pays", 9.0, steady=True)
    judged(auto, "ssm", 40, 20)
    assert auto.run_cost("ssm") > 7.5 and auto.worth_running("ssm") is None  # 5 ms of tokens for 7.8 ms
    for _ in range(200):
        auto.worth_running("ssm")  # idle (an exploring run would not move the steady cost either)
    auto.begin_answer()
    assert auto.run_cost("ssm") == 2.0 and auto.worth_running("ssm") == "pays"


def test_an_ssm_pays_for_the_verify_time_its_nodes_add_too():
    """A run's tokens must beat its drafting and the verify ms its nodes add to the step: here 0.34
    tokens x 10 ms beat a 2.5 ms run and 0.84 ms of verifying; after a miss whose two nodes made the
    step's verify 1 ms dearer, 0.333 do not."""
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import PRIOR_RUNS, AutoDrafting
    from spectui.engine.costs import CostModel

    costs = CostModel({1: 10.0, 2: 10.5, 4: 11.5}, draft_ms={"ssm": 2.5})
    auto = AutoDrafting(costs, AcceptanceModel(kinds={"ssm": "model", "ngram": "ngram"}))
    assert judged(auto, "ssm", 42, 13, verify_ms=38.0) == pytest.approx(0.34)
    assert auto.run_cost("ssm") == pytest.approx(2.5 + (38.0 + PRIOR_RUNS * 0.5) / 50)  # one node a run: c(2) - c(1)
    assert auto.worth_running("ssm") == "pays"
    names = ["ssm", "ngram"]
    tree = TokenTree.with_root(1)
    mine = tree.add(0, 10, 0, 0.6, conf_bin=6)
    tree.add(mine, 11, 0, 0.5, conf_bin=5)
    copied = tree.add(0, 12, 1, 1.0, conf_bin=3)  # the n-gram drafter's: not the SSM's cost
    tree.add(copied, 12, 0, 0.5, conf_bin=5)
    tree.add(copied, 12, 1, 1.0, conf_bin=3)  # both proposed it: a free drafter's too
    tree.mark_contested()
    auto.observe(tree, [], names, ["ssm"], 12.0)  # none accepted: gain 0.34 -> 17 / 51; 2 ms over c_verify(1)
    assert auto.answer["ssm"].verify_ms == pytest.approx(38.0 + 2 / 4 * 2.0)  # its 2 of the 4 nodes, not the others
    assert auto.node_ms == pytest.approx(0.5)
    assert 2.5 < auto.gain("ssm") * 10.0 < auto.run_cost("ssm")
    assert auto.worth_running("ssm") is None
    auto.observe(tree, [], names, ["ssm"], 10_000.0)  # a stalled step: at most c_verify(1) a node
    assert auto.answer["ssm"].verify_ms == pytest.approx(39.0 + 2 * 10.0)
    assert auto.node_ms == pytest.approx(0.5 + 0.25 * (10.0 - 0.5))


def test_each_answer_judges_an_ssm_afresh_from_an_optimistic_prior():
    """gain is this answer's credited tokens a run after PRIOR_RUNS runs at GAIN_PRIOR: a new answer
    starts every SSM at the prior (whatever the last answer showed); one that adds nothing stops within
    about PRIOR_RUNS runs; one that adds a token every other run keeps running through two misses in a
    row (the old moving average, weight 0.25 from 0.5, fell below this cost in the second such stretch)."""
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import GAIN_PRIOR, PRIOR_RUNS, AutoDrafting
    from spectui.engine.costs import CostModel

    costs = CostModel({1: 10.0, 2: 10.0}, draft_ms={"ssm": 3.0})  # a free node: only the 3 ms run is judged
    auto = AutoDrafting(costs, AcceptanceModel(kinds={"ssm": "model"}))
    names = ["ssm"]

    def step(accepted: bool) -> str | None:
        why = auto.worth_running("ssm")
        if why is not None:
            tree = TokenTree.with_root(1)
            node = tree.add(0, 10, 0, 0.6, conf_bin=6)
            auto.observe(tree, [node] if accepted else [], names, names, 10.0)
        return why

    judged(auto, "ssm", 30, 0)  # the last answer: nothing
    auto.begin_answer()
    assert auto.gain("ssm") == GAIN_PRIOR and step(False) == "pays"
    runs = 1 + sum(step(False) == "pays" for _ in range(40))
    assert PRIOR_RUNS // 2 <= runs <= 2 * PRIOR_RUNS  # 4 / (n + 8) < 0.3: n = 6 runs
    auto.begin_answer()
    outcomes = [True, False, False] * 3 + [True, False] * 10  # two misses in a row, then one in two
    assert all(step(hit) == "pays" for hit in outcomes)
    assert auto.gain("ssm") > 0.3


def test_accepted_tokens_are_credited_to_the_first_ssm_that_drafted_them():
    """Two SSMs that agree must not both look useless: a shared token goes to the first (engine
    order), a token the free n-gram drafter also had goes to none, a token only the second had to it."""
    from spectui.engine.auto_tree import credited
    from spectui.engine.tree import TokenTree

    names = ["feature", "boost", "ngram"]
    tree = TokenTree.with_root(1)
    shared = tree.add(0, 10, 0, 0.9)  # drafted by feature ...
    tree.add(0, 10, 1, 0.8)  # ... and boost
    copied = tree.add(shared, 11, 2, 1.0)  # the n-gram drafter's, boost's as well
    tree.add(shared, 11, 1, 0.7)
    own = tree.add(copied, 12, 1, 0.6)  # boost's alone
    assert credited(tree, [shared, copied, own], names, ["feature", "boost"]) == {"feature": 1, "boost": 1}
    assert credited(tree, [shared], names, ["boost", "feature"][::-1]) == {"feature": 1, "boost": 0}


def test_drafting_cost_is_a_steps_forwards_not_a_long_catch_up():
    """Feeding an SSM a whole prompt (its first step) or the steps it sat out is not what a step of
    drafting costs: those forwards are left out of its drafting cost, usual short catch-ups count."""
    import time

    from spectui.engine.acceptance_model import AcceptanceModel, prob_bin
    from spectui.engine.auto_tree import STEADY_CATCH_UP, AutoDrafting
    from spectui.engine.costs import CostModel

    class SleepingDrafter:  # a drafter whose forwards take known times: 2 ms a fed token, 2 ms a level
        kind, name = "model", "ssm"

        def __init__(self) -> None:
            self.seen = self.fed_last = self.levels = 0

        def begin(self, committed, tree, source, width):
            self.fed_last, self.seen = len(committed) - self.seen, len(committed)
            time.sleep(0.002 * self.fed_last)
            return [tree.add(0, 7, source, 0.9, prob_bin(0.9))]

        def expand(self, tree, source, frontier, width):
            time.sleep(0.002)
            self.levels += 1
            return [tree.add(frontier[0], 8 + tree.depths[frontier[0]], source, 0.9, prob_bin(0.9))]

        def finish(self) -> None:
            pass

    costs = CostModel({1: 40.0, 2: 41.0, 4: 42.0, 8: 44.0})  # no drafting cost known yet: the first one is taken whole
    auto = AutoDrafting(costs, AcceptanceModel(kinds={"ssm": "model"}))
    drafter = SleepingDrafter()
    auto.draft(list(range(60)), [drafter], "union")  # catches up 60 tokens: 120 ms
    assert drafter.fed_last > STEADY_CATCH_UP and costs.draft("ssm") < 5.0  # counted, it would be >= 13 ms
    drafter.levels = 0
    auto.draft(list(range(62)), [drafter], "union")  # a usual step: 2 tokens, 4 ms
    assert drafter.fed_last <= STEADY_CATCH_UP and 1.5 < costs.draft("ssm") < 10.0
    # the run is judged by all of it: the 4 ms catch-up and every level, not its last forward
    assert auto.answer["ssm"].steady == 1 and auto.answer["ssm"].run_ms >= 0.95 * (4.0 + 2.0 * drafter.levels)


def test_a_steps_costs_are_the_models_each_asked_once():
    from spectui.engine.auto_tree import step_costs
    from spectui.engine.costs import CostModel

    costs = CostModel({1: 47.0, 2: 54.0, 4: 67.0, 8: 77.0}, prefix_len=160)
    asked = []
    real = costs.verify
    costs.verify = lambda size: asked.append(size) or real(size)
    verify = step_costs(costs)
    assert [verify(size) for size in (1, 3, 3, 16, 1)] == [real(1), real(3), real(3), real(16), real(1)]
    assert asked == [1, 3, 16]


def test_a_node_another_speculator_contests_is_marked_and_kept_through_select():
    """contested: a sibling was proposed by a speculator that did not propose the node; a speculator's
    own alternatives (its top-2 under one parent) do not contest each other."""
    tree = TokenTree.with_root(1)
    a = tree.add(0, 10, source=0, prob=0.9)  # speculator 0's draft ...
    b = tree.add(0, 11, source=1, prob=1.0)  # ... and speculator 1's, another token: both contested
    c = tree.add(a, 12, source=0, prob=0.6)
    d = tree.add(a, 13, source=0, prob=0.3)  # speculator 0's own alternatives under a
    e = tree.add(b, 14, source=1, prob=1.0)  # alone under b
    f = tree.add(0, 15, source=0, prob=0.05)
    tree.add(0, 15, source=1, prob=1.0)  # both propose 15: f holds both, no sibling has a source it lacks
    flags = tree.mark_contested()
    assert [flags[i] for i in (0, a, b, c, d, e, f)] == [False, True, True, False, False, False, False]
    kept = tree.select([True, True, False, True, False, False, True])  # b dropped: a stays contested
    assert kept.contested == [False, True, False, False]


def test_the_ngram_drafters_rival_matches_contest_each_other():
    """Sources in `rivals` (the n-gram drafter: two matches, two continuations) contest their own
    siblings; other speculators' own alternatives still do not, and an only child never is."""
    tree = TokenTree.with_root(1)
    first = tree.add_path([10, 11, 12], source=1, conf_bin=5)  # the longest match's continuation
    second = tree.add_path([20, 21], source=1, conf_bin=2)  # another match's, diverging at the root
    a = tree.add(first[0], 30, source=0, prob=0.6)  # the SSM's top-2 under 10: siblings of 11
    b = tree.add(first[0], 31, source=0, prob=0.3)
    flags = tree.mark_contested(rivals=1 << 1)
    assert [flags[i] for i in first] == [True, True, False]  # 11 is contested by the SSM's 30 and 31
    assert [flags[i] for i in second] == [True, False]
    assert flags[a] and flags[b]  # 11 is the n-gram drafter's, not the SSM's
    alone = TokenTree.with_root(1)
    chain = alone.add_path([10, 11], source=1, conf_bin=5)
    assert alone.mark_contested(rivals=1 << 1) == [False, False, False] and len(chain) == 2
    assert tree.mark_contested()[second[0]] is False  # without rivals: one speculator, no contest


def test_auto_drafting_marks_the_ngram_drafters_two_matches_contested():
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import AutoDrafting
    from spectui.engine.costs import CostModel
    from spectui.engine.drafters import NGramDrafter

    ngram = NGramDrafter()
    committed = [5, 6, 7, 8, 9, 5, 6, 3, 4, 2, 5, 6]  # "5 6" came twice: followed by 7 and by 3
    assert [chain[0] for chain, _ in ngram.matches(committed)] == [3, 7]
    costs = CostModel({1: 10.0, 2: 10.01, 4: 10.02, 8: 10.04, 16: 10.08, 32: 10.16})  # nodes nearly free
    auto = AutoDrafting(costs, AcceptanceModel(kinds={"ngram": "ngram"}))
    tree, ran, _ = auto.draft(committed, [ngram], "union")
    depth_one = [i for i in range(1, len(tree)) if tree.depths[i] == 1]
    assert ran == [] and sorted(tree.tokens[i] for i in depth_one) == [3, 7]
    assert all(tree.contested[i] for i in depth_one)
    assert not any(tree.contested[i] for i in range(1, len(tree)) if tree.depths[i] > 1)


def test_contested_nodes_learn_apart_from_uncontested_ones():
    from spectui.engine.acceptance_model import CONTESTED_PRIOR, AcceptanceModel
    from spectui.engine.auto_tree import AutoDrafting
    from spectui.engine.costs import CostModel

    model = AcceptanceModel(kinds={"ssm": "model", "ngram": "ngram"})
    assert model.cell("ssm", 1, 5, contested=True).prior == CONTESTED_PRIOR * model.cell("ssm", 1, 5).prior
    auto = AutoDrafting(CostModel({1: 10.0, 2: 11.0, 4: 12.0}), model)
    names = ["ssm", "ngram"]
    for _ in range(40):  # they disagree: the n-gram drafter is right, the SSM's token rejected
        tree = TokenTree.with_root(1)
        ssm = tree.add(0, 10, source=0, prob=0.75, conf_bin=7)
        ngram = tree.add(0, 11, source=1, prob=1.0, conf_bin=3)
        tree.mark_contested()
        auto.observe(tree, [ngram], names, [], 11.0)
        alone = TokenTree.with_root(1)  # alone, its drafts at that confidence hold
        alone.add(0, 10, source=0, prob=0.75, conf_bin=7)
        alone.mark_contested()
        auto.observe(alone, [1], names, [], 11.0)
    accept = auto.predictor(tree, names)
    assert accept(ssm) < 0.1 < 0.9 < auto.predictor(alone, names)(1)
    rows = {(r["speculator"], r["contested"]): r for r in model.calibration()}
    assert rows[("ssm", True)]["observed"] == 0.0 and rows[("ssm", False)]["observed"] == 1.0
    assert rows[("ngram", True)]["observed"] == 1.0


@pytest.mark.parametrize("merge", ["union", "vote"])
@pytest.mark.parametrize("node_ms", [0.001, 0.5, 3.0])
def test_the_step_keeps_the_best_subtree_of_everything_drafted(merge, node_ms):
    """draft() returns select_nodes' choice over the whole drafted tree (after the merge policy), with
    AcceptanceModel.predict's values, however many levels the SSM ran: the last level's choice stands
    only where nothing was drafted or voted away after it. Nearly free nodes let the SSM run every
    level up to MAX_DEPTH; dear ones stop it early."""
    from spectui.engine.acceptance_model import AcceptanceModel, prob_bin
    from spectui.engine.auto_tree import MAX_DEPTH, AutoDrafting, named_evidence
    from spectui.engine.costs import CostModel
    from spectui.engine.drafters import NGramDrafter
    from spectui.engine.merge import apply_policy

    class Drafter:  # top-2 children under each fed node (under the root: the n-gram drafter's 3, then 101)
        kind, name, fed_last = "model", "ssm", 1

        def begin(self, committed, tree, source, width):
            self.tree = tree  # the step's whole tree
            return [tree.add(0, token, source, p, prob_bin(p)) for token, p in ((3, 0.9), (101, 0.05))]

        def expand(self, tree, source, frontier, width):
            return [tree.add(node, 100 + 10 * tree.depths[node] + k, source, p, prob_bin(p))
                    for node in frontier for k, p in enumerate((0.9, 0.05))]

        def finish(self) -> None:
            pass

    costs = CostModel({t: 10.0 + node_ms * (t - 1) for t in (1, 2, 4, 8, 16, 32, 64)})
    model = AcceptanceModel(kinds={"ssm": "model", "ngram": "ngram"})
    auto = AutoDrafting(costs, model)
    drafter, names = Drafter(), ["ngram", "ssm"]
    committed = [5, 6, 7, 8, 9, 5, 6, 3, 4, 2, 5, 6]  # the n-gram drafter's matches: 3 4 2 ... and 7 8 9 ...
    chosen, ran, plan = auto.draft(committed, [NGramDrafter(), drafter], merge)
    whole = apply_policy(drafter.tree, merge)
    values = [1.0] + [0.0] * (len(whole) - 1)
    for i in range(1, len(whole)):
        a = model.predict(named_evidence(whole, i, names), whole.depths[i], whole.contested[i])
        values[i] = values[whole.parents[i]] * a
    want = select_nodes(whole, values, costs.verify, auto.target_rate())
    assert ran == ["ssm"] and plan.keep == want.keep and plan.expected_tokens == want.expected_tokens
    assert chosen.tokens == whole.select(want.keep).tokens and plan.cost_ms >= costs.verify(plan.size)
    if node_ms < 0.01:  # every level ran: the last one's nodes are in the choice
        assert max(d for d, sources in zip(drafter.tree.depths, drafter.tree.sources) if sources & 2) == MAX_DEPTH
    assert (len(whole) < len(drafter.tree)) == (merge == "vote")  # the vote keeps 3 alone under the root


def test_a_node_must_beat_the_margin_over_the_rate_not_the_rate_alone():
    """NODE_MARGIN: a drafted node whose expected tokens only just beat R times the ms it adds is left out
    (the nodes a step takes are those whose predictions flatter them most); one above the margin is kept."""
    from spectui.engine.acceptance_model import AcceptanceModel
    from spectui.engine.auto_tree import NODE_MARGIN, AutoDrafting
    from spectui.engine.costs import CostModel

    costs = CostModel({t: 10.0 + 1.0 * (t - 1) for t in (1, 2, 4, 8, 16, 32, 64)})  # a node adds 1 ms
    auto = AutoDrafting(costs, AcceptanceModel(kinds={}))
    assert NODE_MARGIN > 1 and auto.target_rate() == pytest.approx(NODE_MARGIN / 10.0)
    auto.observe_rate(3, 20.0)  # a realised 0.15 tokens per ms beats an incremental step's 0.1
    assert auto.target_rate() == pytest.approx(NODE_MARGIN * 0.15)
    auto.realised = None
    tree = TokenTree.with_root(0)
    tree.add_path([1], 0)
    just_above_r = 0.5 * (1 + NODE_MARGIN) * 0.1  # v > R * 1 ms, v < NODE_MARGIN * R * 1 ms
    for v, kept in ((just_above_r, False), (NODE_MARGIN * 0.1 + 0.01, True)):
        plan = select_nodes(tree, [1.0, v], costs.verify, auto.target_rate())
        assert plan.size == (2 if kept else 1)
        assert select_nodes(tree, [1.0, v], costs.verify, 0.1).size == 2  # at R alone both would pay
