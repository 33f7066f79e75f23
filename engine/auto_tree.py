"""Adaptive speculation (`--tree auto`): each step, the tree that maximises expected tokens per ms.

A step that verifies a tree of T nodes (root included) after drafting for D ms commits

    E[tokens] = 1 + sum_{u in tree, u != root} v(u)          (the bonus token is always committed)

where v(u) = a(u) * v(parent(u)) is the probability that u is accepted (acceptance_model.py),
and costs D + c_verify(T) ms (costs.py). The step's rate is E[tokens] / (D + c_verify(T)).

Which tree: maximising the step's own ratio would count drafting already done as a reason to
verify more (its ms are sunk), so the choice maximises the step's surplus over a target rate R,

    J(tree) = E[tokens] - R * c_verify(T),   R = max(1 / c_verify(1), recent realised tokens per ms)

(Dinkelbach's method for a ratio: with R the best long-run rate, the tree maximising J is the
tree that raises that rate). A node pays when v(u) > R * (the verify ms it adds): marginal
against average. The root alone (T = 1) has J = 1 - R * c_verify(1) <= 0 and is always a
candidate, so under its own model the chosen tree has expected tokens per verify ms >= 1 / c_verify(1):
never worse than an incremental step.

The rate a node must beat is NODE_MARGIN times that R. The nodes a step takes are those whose
predicted v is highest, so their predictions are the likeliest to flatter them (the winner's curse
of choosing by an estimate): a node predicted just above R * its ms is worth less than that in
expectation. Three A/Bs, each in one process, on held-out tuning prompts (20-40 short and 6-8 long
each, 64 tokens, 3 rounds each, interleaved; docs/performance.md, stop 62): auto at 1.25 R over auto
at R read 1.020x on the short prompts (rounds 0.954-1.063) and 1.008x on the long ones, with trees
0.1-0.3 tokens a step smaller and the slowest prompt's median higher in both larger runs.

select_nodes: v never grows down a path (a <= 1), so the nodes sorted by decreasing v (ties by
index, which puts parents first) give, for every k, a valid tree of the k best nodes: the best
k-node subtree in expected tokens. All k are scanned (c_verify is concave: the next node may be
cheaper than the last) and the best J is kept.

AutoDrafting decides what to draft:
- the n-gram drafter costs nothing measurable: its matches (up to 2 chains of 12) always join;
- an SSM runs only while it pays: `gain` is the tokens a run of it adds in this answer: the accepted
  tokens credited to it (`credited`: to the first SSM that drafted them, none if the n-gram drafter had
  them) over its runs so far, after PRIOR_RUNS runs at GAIN_PRIOR,

      gain = (credited tokens + PRIOR_RUNS * GAIN_PRIOR) / (runs + PRIOR_RUNS),

  begun afresh by every answer (`begin_answer`): how well a drafter agrees follows the prompt (the
  feature head pays on chat, qa and maths and not on translation). A moving average carried across
  answers (weight 0.25) swings by about 0.2 tokens a run for runs that add 0 or 1 token at even odds,
  so a head that paid sat idle after two misses, or because an earlier answer's prompt did not suit it,
  and explored too seldom to come back within an answer. The prior is optimistic: every
  answer tries each SSM, and one that adds little stops within about PRIOR_RUNS runs. It runs when
  gain * c_verify(1) (the ms those tokens would cost incrementally) exceeds what a run of it costs,

      run cost = (ms of this answer's steady runs + PRIOR_RUNS * one forward) / (steady runs + PRIOR_RUNS)
               + (verify ms its nodes added + PRIOR_RUNS * one node's) / (runs + PRIOR_RUNS),

  judged afresh by every answer as the gain is: a steady run is all its forwards of a step; one
  forward is the cost model's mean (costs.draft); a run's verify ms are k / (T - 1) of what the
  step's verification took beyond c_verify(1), for the k of its T - 1 verified nodes credited to it the
  same way, and one node's is the mean of that per-node figure over all steps (`node_ms`). Measured, not
  read off the cost curve: one more row costs more after a long prompt, where the attention reads more
  keys, and the curve's ratios mix all prefixes. A cost carried across answers froze while the SSM
  sat idle: deep runs on a maths prompt (9 ms) then kept the head from ever paying on the chat prompts
  after it, whose runs would take 2-3 ms. Otherwise an SSM explores once it has been idle for n steps with
  n * c_verify(1) * EXPLORE_SHARE >= what an exploring run costs (`explore_ms`: measured, the
  catch-up of the tokens it sat out included; at least MIN_EXPLORE_EVERY steps): exploring costs at
  most EXPLORE_SHARE of incremental time per SSM, however cheap a verify step is next to a draft,
  and a speculator that starts to agree (a copying phase, another topic) is still noticed. (Judging
  exploration without its catch-up let an SSM run for less than it cost once the verifier got faster:
  on a 2-core EPYC an exploring run took ~9 ms against a 8-10 ms step);
- its drafting cost is the mean of its forwards in a step: each level, and the catch-up of the
  committed tokens when it is a step's usual few (STEADY_CATCH_UP); feeding it a whole prompt, or
  the tokens of the steps it sat out, is not what one more step of drafting costs, and counting
  that made an SSM that had been idle look too dear to run again;
- it drafts depth by depth (top-3 under the root, top-2 below, the 2 best candidates fed each
  level) and stops when the next level's best hope, v(best frontier node) * a_next, per ms it would
  add (one SSM forward + one more verified node) no longer beats the target rate (NODE_MARGIN R).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .acceptance_model import AcceptanceModel
from .costs import CostModel
from .merge import apply_policy
from .tree import TokenTree

MAX_NODES = 64  # the node budget of an auto tree, root included
NODE_MARGIN = 1.25  # a node must beat this times the target rate (the module docstring)
ROOT_WIDTH, WIDTH, FEED = 3, 2, 2  # SSM candidates under the root, under deeper nodes; nodes fed per level
MAX_DEPTH = 8  # SSM levels per step
EXPLORE_SHARE = 0.015  # of incremental time an SSM that does not pay may spend exploring
MIN_EXPLORE_EVERY = 8  # steps between its explorations, at least
AVERAGE_WEIGHT = 0.25  # of a new value in the moving averages of costs and of the realised rate
GAIN_PRIOR = 0.5  # tokens a run an SSM is assumed to add at the start of an answer ...
PRIOR_RUNS = 8  # ... weighed as this many runs
STEADY_CATCH_UP = 4  # tokens: a catch-up this short is a step's usual forward; longer ones (its first
# step on a prompt, after idle steps) are not timed as its drafting cost


@dataclass
class Plan:
    keep: list[bool]
    expected_tokens: float  # E[tokens] committed by the step, the bonus token included
    cost_ms: float  # drafting + c_verify(T)

    @property
    def size(self) -> int:
        return sum(self.keep)

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.cost_ms if self.cost_ms > 0 else 0.0


def step_costs(costs: CostModel) -> Callable[[int], float]:
    """costs.verify for one step's choices, each size computed once (the tree choice asks for each
    size many times a step, and the curve changes after every step)."""
    known: dict[int, float] = {}

    def verify(size: int) -> float:
        ms = known.get(size)
        if ms is None:
            ms = known[size] = costs.verify(size)
        return ms
    return verify


def node_values(tree: TokenTree, accept: Callable[[int], float]) -> list[float]:
    """v[i]: probability that node i is accepted = a(i) * v(parent); v[root] = 1."""
    values = [1.0] * len(tree)
    for i in range(1, len(tree)):
        values[i] = values[tree.parents[i]] * accept(i)
    return values


def select_nodes(tree: TokenTree, values: list[float], verify_ms: Callable[[int], float], rate: float,
                 budget: int = MAX_NODES) -> Plan:
    """The subtree of `tree` maximising E[tokens] - rate * c_verify(T) (see the module docstring); its
    cost_ms is c_verify(T) alone (the step adds its drafting ms once drafting is done)."""
    order = sorted(range(1, len(tree)), key=lambda i: (-values[i], i))[: max(budget - 1, 0)]
    expected, best_k, best = 1.0, 0, 1.0 - rate * verify_ms(1)
    for k, node in enumerate(order, 1):
        expected += values[node]
        surplus = expected - rate * verify_ms(k + 1)
        if surplus > best:
            best_k, best = k, surplus
    keep = [False] * len(tree)
    keep[0] = True
    for node in order[:best_k]:
        keep[node] = True
    for i in range(1, len(tree)):  # parents precede children: enforce closure under ancestors
        keep[i] = keep[i] and keep[tree.parents[i]]
    chosen = sum(values[i] for i in range(1, len(tree)) if keep[i])
    return Plan(keep, 1.0 + chosen, verify_ms(sum(keep)))


def named_evidence(tree: TokenTree, node: int, names: list[str]) -> dict[str, int]:
    """Node's {speculator name: confidence bin}, as the acceptance model keys it."""
    return {names[source]: conf_bin for source, conf_bin in tree.evidence[node].items()}


def credited(tree: TokenTree, nodes: list[int], names: list[str], ran: list[str]) -> dict[str, int]:
    """Of `nodes` (the accepted ones, or all the verified ones), how many each SSM that ran is credited
    with: a node goes to the first SSM (in the engine's order) whose draft held it, and to none if a
    free drafter (n-gram: not in `ran`) held it too.

    Crediting only the tokens a speculator proposed alone would starve two SSMs that agree with each
    other: each one's share of their common tokens would be zero, both would look useless and both
    would stop, losing what either alone gives. Crediting in order makes the first SSM's gain what it
    gives by itself and each later one's what it adds to those before it."""
    order = [names.index(name) for name in ran]  # ran follows the engine's order of drafters
    ran_bits = sum(1 << k for k in order)
    counts = dict.fromkeys(ran, 0)
    for i in nodes:
        sources = tree.sources[i]
        if sources & ~ran_bits:  # a free drafter proposed it as well
            continue
        first = next((k for k in order if sources >> k & 1), None)
        if first is not None:
            counts[names[first]] += 1
    return counts


def moving(average: float | None, value: float) -> float:
    """A moving average: the first value as is, then AVERAGE_WEIGHT of each new one."""
    return value if average is None else average + AVERAGE_WEIGHT * (value - average)


@dataclass
class Record:
    """One SSM in this answer: what its runs gave and cost."""

    runs: int = 0  # runs whose step was verified
    tokens: int = 0  # accepted tokens credited to it
    verify_ms: float = 0.0  # verify ms its nodes added to those steps
    steady: int = 0  # steady runs timed (a few committed tokens to catch up)
    run_ms: float = 0.0  # their drafting ms, all their forwards


@dataclass
class AutoDrafting:
    costs: CostModel
    acceptance: AcceptanceModel
    answer: dict[str, Record] = field(default_factory=dict)  # SSM -> its record in this answer
    idle: dict[str, int] = field(default_factory=dict)  # SSM -> steps since it last drafted
    explore_ms: dict[str, float] = field(default_factory=dict)  # SSM -> moving average ms of an exploring run, catch-up included
    node_ms: float | None = None  # moving average verify ms one drafted node adds to a step, all steps
    realised: float | None = None  # moving average of committed tokens per ms of engine time, all steps

    def begin_answer(self) -> None:
        """A new answer judges each SSM afresh (gain and run cost); exploration's cost, the per-node verify
        cost and the acceptance model carry over."""
        self.answer.clear()

    def record(self, name: str) -> Record:
        return self.answer.setdefault(name, Record())

    def gain(self, name: str) -> float:
        """Tokens a run of `name` adds in this answer (the module docstring)."""
        r = self.answer.get(name, Record())
        return (r.tokens + PRIOR_RUNS * GAIN_PRIOR) / (r.runs + PRIOR_RUNS)

    def run_cost(self, name: str) -> float:
        """Ms a run of `name` costs in this answer, drafting and the verify time its nodes add (the module
        docstring)."""
        r = self.answer.get(name, Record())
        node_ms = self.node_ms if self.node_ms is not None else max(self.costs.verify(2) - self.costs.verify(1), 0.0)
        drafting = (r.run_ms + PRIOR_RUNS * self.costs.draft(name)) / (r.steady + PRIOR_RUNS)
        return drafting + (r.verify_ms + PRIOR_RUNS * node_ms) / (r.runs + PRIOR_RUNS)

    def target_rate(self) -> float:
        """Tokens per ms a node must beat: NODE_MARGIN times R, R never below an incremental step's rate."""
        return NODE_MARGIN * max(1.0 / self.costs.verify(1), self.realised or 0.0)

    def observe_rate(self, tokens: int, step_ms: float) -> None:
        if step_ms > 0:
            self.realised = moving(self.realised, tokens / step_ms)

    def predictor(self, tree: TokenTree, names: list[str]) -> Callable[[int], float]:
        """a(i) for the nodes of `tree` as it stands when asked (its contested flags marked first), each
        cell's mean looked up once (the model does not change while a step drafts)."""
        means: dict = {}
        predict = self.acceptance.predict

        def accept(i: int) -> float:
            return predict(tree.evidence[i], tree.depths[i], tree.contested[i], names, means)
        return accept

    def worth_running(self, name: str) -> str | None:
        """"pays" (its gain in incremental ms beats what a steady run of it costs), "explore" (idle long
        enough that this run, catch-up included, stays within EXPLORE_SHARE of incremental time), or None."""
        c1 = self.costs.verify(1)
        if self.gain(name) * c1 > self.run_cost(name):
            self.idle[name] = 0
            return "pays"
        self.idle[name] = self.idle.get(name, 0) + 1
        every = max(MIN_EXPLORE_EVERY, self.explore_ms.get(name, self.costs.draft(name)) / (EXPLORE_SHARE * c1))
        if self.idle[name] >= every:
            self.idle[name] = 0
            return "explore"
        return None

    def observe_run(self, name: str, why: str, ms: float, steady: bool) -> None:
        """Add one run's drafting ms to the cost its kind of run is judged by: a steady paying run (a few
        committed tokens to catch up) to this answer's record, an exploring one, whatever it caught up, to
        explore_ms."""
        if why == "explore":
            self.explore_ms[name] = moving(self.explore_ms.get(name), ms)
        elif steady:
            r = self.record(name)
            r.steady += 1
            r.run_ms += ms

    def draft(self, committed: list[int], drafters: list, merge: str,
              max_depth: int | None = None) -> tuple[TokenTree, list[str], Plan]:
        """Draft and choose this step's tree -> (tree, names of the SSMs that ran, plan); max_depth: the
        deepest node that could still be committed (the answer's length limit), None for no limit."""
        start = time.perf_counter()
        names = [d.name for d in drafters]
        rivals = sum(1 << source for source, d in enumerate(drafters) if d.kind == "ngram")  # its matches contest
        deepest = MAX_DEPTH if max_depth is None else min(MAX_DEPTH, max_depth)  # SSM levels
        tree = TokenTree.with_root(committed[-1])
        for source, drafter in enumerate(drafters):
            if drafter.kind == "ngram":
                drafter.draft_matches(committed, tree, source, max_depth)
        accept = self.predictor(tree, names)
        rate = self.target_rate()
        verify = step_costs(self.costs)
        ran = []
        planned: Plan | None = None  # the choice over the tree as it stands (None once it has grown)
        for source, drafter in enumerate(drafters):
            why = self.worth_running(drafter.name) if drafter.kind == "model" else None
            if why is None:
                continue
            run_began = began = time.perf_counter()
            candidates = drafter.begin(committed, tree, source, ROOT_WIDTH)
            planned = None
            steady = drafter.fed_last <= STEADY_CATCH_UP
            forwards = [time.perf_counter() - began] if steady else []
            for depth in range(2, deepest + 1):
                if not candidates:
                    break
                tree.mark_contested(rivals)
                values = node_values(tree, accept)
                plan = select_nodes(tree, values, verify, rate)
                planned = plan
                frontier = sorted(set(candidates), key=lambda i: (-values[i], i))[:FEED]
                hope = values[frontier[0]] * self.acceptance.mean_for(drafter.name, depth)
                extra_ms = self.costs.draft(drafter.name) + verify(plan.size + 1) - verify(plan.size)
                if hope <= rate * extra_ms:
                    break
                began = time.perf_counter()
                candidates = drafter.expand(tree, source, frontier, WIDTH)
                planned = None
                forwards.append(time.perf_counter() - began)
            drafter.finish()
            if forwards:
                self.costs.observe_draft(drafter.name, sum(forwards) * 1000 / len(forwards))
            self.observe_run(drafter.name, why, (time.perf_counter() - run_began) * 1000, steady)  # the whole run
            ran.append(drafter.name)
        if planned is None or merge != "union":  # else the last level's choice stands: the tree is as it was
            tree.mark_contested(rivals)  # before the vote: where speculators disagreed is evidence, whatever it drops
            tree = apply_policy(tree, merge)
            planned = select_nodes(tree, node_values(tree, self.predictor(tree, names)), verify, rate)
        planned.cost_ms += (time.perf_counter() - start) * 1000  # drafting + c_verify(T)
        return tree.select(planned.keep), ran, planned

    def observe(self, tree: TokenTree, accepted: list[int], names: list[str], ran: list[str], verify_ms: float) -> None:
        """Fold a verified step (its verification took verify_ms) into the acceptance model, the SSMs'
        records of this answer and the verify time their nodes add."""
        reached = {0, *accepted}
        for i in range(1, len(tree)):
            if tree.parents[i] in reached:
                self.acceptance.observe(named_evidence(tree, i, names), tree.depths[i], i in reached, tree.contested[i])
        size = len(tree)
        c1 = self.costs.verify(1)  # a one-token step now (this step, T > 1, is not among its observations)
        per_node = min(max(verify_ms - c1, 0.0) / (size - 1), c1) if size > 1 else 0.0  # capped: a stalled step
        if size > 1:
            self.node_ms = moving(self.node_ms, per_node)
        own = credited(tree, accepted, names, ran)
        for name, nodes in credited(tree, list(range(1, size)), names, ran).items():
            r = self.record(name)
            r.runs += 1
            r.tokens += own[name]
            r.verify_ms += nodes * per_node
