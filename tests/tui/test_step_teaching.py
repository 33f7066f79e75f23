"""Step mode that teaches: the legend of q and p, each drafted node's state (accepted, rejected, not
reached), the sampling test's numbers (u, min(1, p'/q), the bonus token's residual), and an
explanation that follows the step shown while browsing (F7/F8).

Two traces recorded with the real engine: france.jsonl (greedy, n-gram drafts) and sampling.jsonl
(temperature 0.6, top-p 0.95, tree 2,1,1, the embedded preset's three speculators, recorded with
`detail`, so each step carries the numbers its sampling test used).
"""

from __future__ import annotations

import json

import pytest
from textual.widgets import Tree

from spectui.chat_app import ChatApp
from spectui.engine.events import StepEvent, TreeNode, read_trace
from spectui.replay import read_turns
from spectui.replay_app import ReplayApp
from spectui.widgets.step_explain import ACCEPTED, AFTER_END, NOT_REACHED, REJECTED, explain, node_states

from tui_helpers import DATA, TRACE, text_shown

pytestmark = pytest.mark.anyio

SAMPLING = DATA / "sampling.jsonl"
RESIDUAL_STEP = 9  # sampling.jsonl: three drafts rejected at the root, the bonus drawn from a residual


def labels(app) -> list[str]:
    """Every line of the token tree, root first."""
    tree = app.chat.query_one("#tree", Tree)
    out, todo = [], [tree.root]
    while todo:
        node = todo.pop(0)
        out.append(str(node.label))
        todo[:0] = node.children
    return out


async def play(pilot, steps: int) -> None:
    """n, `steps` times: the replay's first `steps` verifier steps, drawn."""
    await pilot.press(*"n" * steps)
    await pilot.pause(0.3)


def decision(app) -> str:
    return str(app.chat.query_one("#decision-text").render())


def test_greedy_states_accepted_rejected_and_below_a_rejection():
    _, events = read_trace(TRACE)
    event = events[2]  # ' of' ' France' accepted, '?' rejected, its subtree never tested
    assert [n.text for n in event.tree[1:]] == [" of", " France", "?", "<|im_end|>", "\n", "<|im_start|>"]
    assert node_states(event) == {1: ACCEPTED, 2: ACCEPTED, 3: REJECTED, 4: NOT_REACHED, 5: NOT_REACHED, 6: NOT_REACHED}
    text = explain(event, greedy=True)
    assert "✓ ' France' is the verifier's top token after ' of' (p 1.00)" in text
    assert "✗ '?' is not its top token after ' France' (p 0.00)" in text
    assert "○ not reached, below a rejected token: '<|im_end|>', '\\n', '<|im_start|>'" in text


def test_sampling_states_follow_the_recorded_test():
    _, events = read_trace(SAMPLING)
    event = events[6]  # ' known' ' as' ' the' accepted at the first try each: their siblings were never tested
    tested = [t.node for t in event.sampling.tests]
    assert tested == event.accepted == [1, 3, 5]
    states = node_states(event)
    assert {n for n, s in states.items() if s == ACCEPTED} == {1, 3, 5}
    assert {n for n, s in states.items() if s == REJECTED} == set()
    assert all(s == NOT_REACHED for n, s in states.items() if n not in (1, 3, 5))
    text = explain(event, greedy=False)
    assert "○ not tested, a sibling before it was accepted: ' in', ' be', ' help'" in text
    assert "○ not reached, below an untested token: ' France', '.', ' the', ' you', ' few', ' with'" in text
    assert "○ not reached, below a rejected or untested token:" in explain(events[10], greedy=False)
    assert "In this test q(x) = 1" in text  # what q means in the test, where the tree's q is the SSM's
    assert "★ bonus ' capital' (0.258) drawn from p at ' the': nothing was drafted below it" in text
    assert "  p: ' City' 0.534 · ' capital' 0.258" in text
    rejected_without_mass = explain(events[5], greedy=False)  # ' and' rejected below ',' where p(' and') = 0
    assert "★ bonus ' also' (0.615) drawn from the residual at ',': its rejected drafts had no mass, so p itself" in rejected_without_mass


def test_an_answer_that_ends_inside_the_branch():
    """The token limit cut the accepted branch: the rest was accepted by the verifier but not used."""
    tree = [TreeNode(0, -1, 0, 5, "a", [], None, None), TreeNode(1, 0, 1, 6, "b", ["ngram"], 1.0, 0.9),
            TreeNode(2, 1, 2, 7, "c", ["ngram"], 1.0, 0.8), TreeNode(3, 2, 3, 8, "d", ["ngram"], 1.0, 0.7)]
    event = StepEvent(step=3, tree=tree, accepted=[1], bonus_token=None, bonus_text="", new_tokens=[6], new_text="b",
                      token_origins=["ngram"], drafted=3, accepted_count=3, draft_ms=0.0, verify_ms=1.0,
                      attention_backend="exact", finished=True, stop_reason="length")
    assert node_states(event) == {1: ACCEPTED, 2: AFTER_END, 3: AFTER_END}
    text = explain(event)
    assert "○ not used, the answer ended (length): 'c', 'd'" in text
    assert "no bonus token: the answer ended (length)" in text and "★" not in text


async def test_sampling_numbers_on_the_tree_and_in_the_decision(fresh_home):
    _, events = read_trace(SAMPLING)
    event = events[RESIDUAL_STEP]
    app = ReplayApp(read_turns(SAMPLING), replay_name=SAMPLING.name, autoplay=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await play(pilot, RESIDUAL_STEP + 1)
        legend = str(app.chat.query_one("#tree-legend").render())
        assert "q  drafter's probability" in legend and "p  verifier's probability" in legend
        assert "u  uniform draw: kept if u < min(1, p'/q)" in legend
        text, lines = decision(app), labels(app)
        for test in event.sampling.tests:  # every test, with the numbers the engine used
            node = event.tree[test.node]
            assert test.accepted is False
            assert f" ✗ '{node.text}'  {test.draw:.3f} ≥ {test.accept_prob:.3f}  p {node.verifier_prob:.2f}" in text
            assert any(line.startswith(f"✗ '{node.text}'") and f"u {test.draw:.2f} ≥ {test.accept_prob:.2f}" in line
                       for line in lines)
        assert event.sampling.removed_mass > 0.8 and [r.text for r in event.sampling.residual_top] == [" is", " and"]
        assert (f"★ bonus ' and' ({event.sampling.bonus_prob:.3f}) drawn from the residual: p at ' Republic' less its "
                f"rejected drafts ({event.sampling.removed_mass:.3f}), renormalised") in text
        assert "residual: ' is' 0.747 · ' and' 0.253" in text
        assert sum(line.startswith("○") for line in lines) == len(event.tree) - 1 - len(event.sampling.tests)


async def test_browsing_back_the_explanation_follows_the_step_shown(fresh_home):
    _, events = read_trace(SAMPLING)
    app = ReplayApp(read_turns(SAMPLING), replay_name=SAMPLING.name, autoplay=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await play(pilot, RESIDUAL_STEP + 1)
        assert decision(app) == explain(events[RESIDUAL_STEP], greedy=False)
        for index in (RESIDUAL_STEP - 1, RESIDUAL_STEP - 2):
            await pilot.press("f7")
            await pilot.pause()
            assert decision(app) == explain(events[index], greedy=False)
            assert f"step {events[index].step}  ({index + 1}/{RESIDUAL_STEP + 1})" in str(app.chat.query_one("#tree-step").render())
            assert labels(app)[0].startswith(repr(events[index].tree[0].text))
        await pilot.press("f8")
        await pilot.pause()
        assert decision(app) == explain(events[RESIDUAL_STEP - 1], greedy=False)
        assert explain(events[RESIDUAL_STEP - 1], greedy=False) != explain(events[RESIDUAL_STEP], greedy=False)


@pytest.mark.parametrize("size, shown, hidden", [((140, 42), "#tree-legend", "#tree-legend-short"),
                                                 ((80, 24), "#tree-legend-short", "#tree-legend")])
async def test_the_legend_shows_in_step_mode_only(fresh_home, size, shown, hidden):
    """F5 in the live chat (no model needed): the legend comes with step mode, one line in a short window."""
    app = ChatApp(autoload=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert app.chat.query_one(shown).region.height == 0
        await pilot.press("f5")
        await pilot.pause()
        legend, other = app.chat.query_one(shown), app.chat.query_one(hidden)
        assert legend.region.height >= 1 and legend.region.width > 0 and other.region.height == 0
        assert "q " in str(legend.render()) and "p " in str(legend.render())
        await pilot.press("f5")
        await pilot.pause()
        assert legend.region.height == 0


async def test_a_sampling_trace_without_the_draws_says_so(fresh_home, tmp_path):
    """Traces written before format 2 have no draws: nothing is made up in their place."""
    old = tmp_path / "old.jsonl"
    lines = [json.loads(line) for line in SAMPLING.read_text().splitlines()]
    for line in lines:
        line.pop("sampling", None)
        line.pop("version", None)
    old.write_text("".join(json.dumps(line) + "\n" for line in lines))
    app = ReplayApp(read_turns(old), replay_name=old.name, autoplay=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await play(pilot, RESIDUAL_STEP + 1)
        text = decision(app)
        assert "no record of this step's test draws" in text and "not accepted (rejected, or never tested)" in text
        assert "u " not in text and "residual" not in text
        assert not any(" u " in line for line in labels(app))


async def test_a_one_token_step_is_not_called_the_prefill(fresh_home):
    """A step that drafted nothing (the engine's timed one-token steps) has no tree: it says so."""
    _, events = read_trace(SAMPLING)
    index = next(i for i, e in enumerate(events) if e.step > 0 and not e.tree)
    app = ReplayApp(read_turns(SAMPLING), replay_name=SAMPLING.name, autoplay=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await play(pilot, index + 1)
        assert labels(app)[0] == "one-token step: nothing drafted"
        assert decision(app).startswith("No draft this step: the verifier decoded")
        for _ in range(index):
            await pilot.press("f7")  # back to the first step: the prefill
        await pilot.pause()
        assert labels(app)[0] == "prefill (prompt)" and decision(app).startswith("Prefill:")


async def test_the_decision_scrolls_with_the_keys_in_a_small_window(fresh_home):
    """At 80x24 the decision of the residual step is cut: Tab reaches it, down and page down bring
    its last line into view, page up its first; left still browses the steps while it has the focus."""
    _, events = read_trace(SAMPLING)
    app = ReplayApp(read_turns(SAMPLING), replay_name=SAMPLING.name, autoplay=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await play(pilot, RESIDUAL_STEP + 1)
        view = app.chat.query_one("#decision")
        first, last = "at ' Republic': u vs min(1, p'/q)", "0/11 drafted accepted)"
        assert first in text_shown(app, view) and last not in text_shown(app, view)  # cut by the window
        for _ in range(8):  # the focus chain: messages, the tree's buttons, the tree, then the decision
            if app.focused is view:
                break
            await pilot.press("tab")
        assert app.focused is view
        await pilot.press("down")
        await pilot.pause()
        assert view.scroll_y == 1 and first not in text_shown(app, view)
        await pilot.press("pagedown", "pagedown", "pagedown")
        await pilot.pause()
        assert view.scroll_y == view.max_scroll_y > 1 and last in text_shown(app, view)
        await pilot.press("pageup", "pageup", "pageup")
        await pilot.pause()
        assert view.scroll_y == 0 and first in text_shown(app, view)
        await pilot.press("left")  # the tree view's key: the step before
        await pilot.pause()
        assert app.focused is view and decision(app) == explain(events[RESIDUAL_STEP - 1], greedy=False)
