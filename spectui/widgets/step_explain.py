"""What one verifier step decided, in words: the teaching text of step mode.

For every drafted node of a StepEvent's tree, its state:

    accepted     on the accepted branch
    rejected     put to the test and refused (greedy: not the verifier's top token; sampling: u >= p')
    not reached  never tested: below a rejected token, or (sampling) after a sibling that was accepted
    after end    never used: the answer ended (end of turn, token limit) before it
    not accepted (sampling steps without a record of their test) rejected or never tested

and the legend of the tree's numbers. Greedy steps are explained from the tree alone. Sampling
steps show the numbers the engine's test used (StepEvent.sampling, recorded with `detail`): each
tested child's uniform draw u against min(1, p'(x)/q(x)), and the residual the bonus token was
drawn from. The drafters propose fixed top-k children, so in that test q is the point mass on the
child's token (q(x) = 1; engine/accept.py): the q on the tree (the drafter's own probability) only
orders the children, and p' is the verifier's p renormalised over what the rejections left.
Nothing here is estimated: every number is one the engine measured or used.
"""

from __future__ import annotations

from rich.text import Text

from ..engine import StepEvent

ACCEPTED, REJECTED, NOT_REACHED, AFTER_END = "accepted", "rejected", "not reached", "after end"
NOT_ACCEPTED = "not accepted"  # sampling without a record of the test: rejected, or never tested
MARKS = {ACCEPTED: "✓", REJECTED: "✗", NOT_ACCEPTED: "✗", NOT_REACHED: "○", AFTER_END: "○"}
POINT_MASS = ("In this test q(x) = 1: the drafts are top-k picks, point masses (the tree's q only orders them); "
              "p' is p renormalised over what earlier rejections at that node left, so min(1, p'/q) = p'.")


def show_token(text: str) -> str:
    return repr(text)[1:-1].join("''") if text else "''"


def fmt_prob(p: float | None) -> str:
    return "-" if p is None else f"{p:.2f}"


def legend(greedy: bool, compact: bool = False) -> Text:
    """What q, p (and u) and the marks on the tree mean (compact: one line, for short windows)."""
    if compact:
        return Text("q drafter · p verifier probability", style="dim")
    text = Text(style="dim")
    text.append("q", style="bold").append("  drafter's probability (n-gram: 1.00)\n")
    text.append("p", style="bold").append("  verifier's probability after the parent\n" if greedy
                                          else "  verifier's probability, as sampled\n")
    if not greedy:
        text.append("u", style="bold").append("  uniform draw: kept if u < min(1, p'/q)\n")
    text.append("✓ accepted ✗ rejected ○ not reached ★ bonus")
    return text


def node_states(event: StepEvent, greedy: bool = True) -> dict[int, str]:
    """Tree node id -> its state this step (root excluded)."""
    path = [0, *event.accepted]
    ended = event.accepted_count > len(event.accepted)  # the answer ended inside the accepted branch
    tested = {test.node: test.accepted for test in event.sampling.tests} if event.sampling else None
    states: dict[int, str] = {}
    for node in event.tree[1:]:
        parent_state = states.get(node.parent, ACCEPTED)  # the root counts as accepted
        if node.id in event.accepted:
            states[node.id] = ACCEPTED
        elif parent_state in (NOT_REACHED, REJECTED, NOT_ACCEPTED):
            states[node.id] = NOT_REACHED
        elif parent_state == AFTER_END or (ended and node.parent == path[-1]):
            states[node.id] = AFTER_END
        elif tested is not None:
            states[node.id] = REJECTED if tested.get(node.id) is False else NOT_REACHED
        else:  # greedy: every child of a node on the branch was compared with the verifier's top token
            states[node.id] = REJECTED if greedy else NOT_ACCEPTED
    return states


def test_numbers(event: StepEvent) -> dict[int, str]:
    """Tested node id -> 'u 0.29 < 0.70' (sampling steps whose test was recorded)."""
    if not event.sampling:
        return {}
    return {t.node: f"u {t.draw:.2f} {'<' if t.accepted else '≥'} {t.accept_prob:.2f}" for t in event.sampling.tests}


def explain(event: StepEvent, greedy: bool = True) -> str:
    """Why each drafted node was accepted, rejected or never tested, one line per decision."""
    if event.step == 0:
        return f"Prefill: the verifier read the prompt and chose the first token {show_token(event.bonus_text)}."
    if len(event.tree) <= 1:
        return f"No draft this step: the verifier decoded {show_token(event.bonus_text)} on its own."
    greedy = greedy and event.sampling is None
    nodes, states = event.tree, node_states(event, greedy)
    if event.sampling:
        lines = test_lines(event, states)
    else:
        lines = [] if greedy else ["Sampling: no record of this step's test draws (an engine or a trace from before "
                                   "they were recorded), so only p is shown."]
        for node_id in decided(event, states):
            node, after = nodes[node_id], show_token(nodes[nodes[node_id].parent].text)
            p = f"p {fmt_prob(node.verifier_prob)}"
            if greedy and states[node_id] == ACCEPTED:
                lines.append(f"✓ {show_token(node.text)} is the verifier's top token after {after} ({p})")
            elif greedy:
                lines.append(f"✗ {show_token(node.text)} is not its top token after {after} ({p})")
            else:
                verdict = "accepted" if states[node_id] == ACCEPTED else "not accepted (rejected, or never tested)"
                lines.append(f"{MARKS[states[node_id]]} {show_token(node.text)} after {after}: {verdict} ({p})")
    lines += untested_lines(event, states)
    lines += bonus_lines(event, greedy)
    if event.sampling:
        lines.append(POINT_MASS)
    lines.append(f"→ {len(event.new_tokens)} token(s) committed in this verifier step "
                 f"({event.accepted_count}/{event.drafted} drafted accepted)")
    return "\n".join(lines)


def test_lines(event: StepEvent, states: dict[int, str]) -> list[str]:
    """The recorded sampling tests, grouped under the node whose children they tested."""
    lines, parent = [], None
    for test in event.sampling.tests:
        node = event.tree[test.node]
        if states[test.node] not in (ACCEPTED, REJECTED):
            continue  # accepted, but after the end of the answer: said below
        if node.parent != parent:
            parent = node.parent
            lines.append(f"at {show_token(event.tree[parent].text)}: u vs min(1, p'/q)")
        sign = "<" if test.accepted else "≥"
        lines.append(f" {MARKS[states[test.node]]} {show_token(node.text)}  {test.draw:.3f} {sign} {test.accept_prob:.3f}"
                     f"  p {fmt_prob(node.verifier_prob)}")
    return lines


def decided(event: StepEvent, states: dict[int, str]) -> list[int]:
    """The nodes compared with the verifier's choice, depth by depth down the accepted branch,
    each node's children in tree order (steps without a recorded sampling test)."""
    on_branch = {0, *event.accepted}
    by_depth = sorted((n for n in event.tree[1:] if n.parent in on_branch), key=lambda n: n.depth)
    return [n.id for n in by_depth if states[n.id] in (ACCEPTED, REJECTED, NOT_ACCEPTED)]


def untested_lines(event: StepEvent, states: dict[int, str]) -> list[str]:
    nodes = event.tree
    below = [n for n in nodes[1:] if states[n.id] == NOT_REACHED and states.get(n.parent, ACCEPTED) != ACCEPTED]
    skipped = [n for n in nodes[1:] if states[n.id] == NOT_REACHED and states.get(n.parent, ACCEPTED) == ACCEPTED]
    ended = [n for n in nodes[1:] if states[n.id] == AFTER_END]
    lines = []
    above = {blocker(event, states, n) == ACCEPTED for n in below}  # True: below a sibling never tested
    under = {frozenset([False]): "a rejected token", frozenset([True]): "an untested token"}.get(
        frozenset(above), "a rejected or untested token")
    for group, why in ((below, f"not reached, below {under}"),
                       (skipped, "not tested, a sibling before it was accepted"),
                       (ended, f"not used, the answer ended ({event.stop_reason})")):
        if group:
            lines.append(f"○ {why}: " + ", ".join(show_token(n.text) for n in group))
    return lines


def blocker(event: StepEvent, states: dict[int, str], node) -> str:
    """The state above the never-tested run of nodes that holds `node`: rejected, or accepted (then
    the run starts at a sibling that was never tested)."""
    while states.get(node.parent) == NOT_REACHED:
        node = event.tree[node.parent]
    return states.get(node.parent, ACCEPTED)


def bonus_lines(event: StepEvent, greedy: bool) -> list[str]:
    if event.bonus_token is None:
        return [f"no bonus token: the answer ended ({event.stop_reason})"] if event.finished else []
    bonus = show_token(event.bonus_text)
    sampling = event.sampling
    if greedy or sampling is None:
        return [f"★ bonus {bonus}: the verifier's {'top token' if greedy else 'own draw'} after the accepted branch"]
    at = show_token(event.tree[sampling.bonus_node].text)
    tested_there = any(event.tree[t.node].parent == sampling.bonus_node for t in sampling.tests)
    if sampling.removed_mass > 0:
        source = f"the residual: p at {at} less its rejected drafts ({sampling.removed_mass:.3f}), renormalised"
    elif tested_there:
        source = f"the residual at {at}: its rejected drafts had no mass, so p itself"
    else:
        source = f"p at {at}: nothing was drafted below it"
    top = " · ".join(f"{show_token(r.text)} {r.prob:.3f}" for r in sampling.residual_top)
    return [f"★ bonus {bonus} ({sampling.bonus_prob:.3f}) drawn from {source}",
            f"  {'residual' if tested_there else 'p'}: {top}"]
