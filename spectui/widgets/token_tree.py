"""TokenTreeView: one verifier step's token tree, with its accepted branch, bonus and decision.

Each node shows its state (✓ accepted, ✗ rejected, ○ not reached), its token, the speculators
that proposed it, the draft probability q and the verifier probability p, and under sampling
the test's draw. The accepted branch is bold in the success colour, nodes never tested are
dimmed, and the bonus token (the verifier's own next token) hangs below the accepted branch
marked with a star. In step mode a legend says what q, p and the marks mean, and the decision
(step_explain.py) why each node was accepted, rejected or never tested; where the window cuts
the decision (step mode at 80x24), it scrolls with the keys once focused (DecisionView). The view
holds every step of the answer: browsing (F7/F8, [ ]) shows an earlier step with its own decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Button, Label, Static, Tree

from ..engine import StepEvent
from .step_explain import ACCEPTED, MARKS, explain, fmt_prob, legend, node_states, show_token, test_numbers


def node_label(node, state: str, test: str | None = None, accent: str = "green") -> Text:
    """'✓ ' of'  q 1.00  p 0.99  ngram', with the sampling test's 'u 0.29 < 0.70' when recorded;
    the numbers first, so that a narrow panel cuts the speculators' names."""
    label = Text(f"{MARKS[state]} {show_token(node.text)}", style="bold" if state == ACCEPTED else "")
    label.append(f"  q {fmt_prob(node.draft_prob)}  p {fmt_prob(node.verifier_prob)}")
    if test:
        label.append(f"  {test}")
    label.append(f"  {'+'.join(node.sources) or '-'}")
    label.stylize(f"bold {accent}" if state == ACCEPTED else ("dim" if MARKS[state] == "○" else ""))
    return label


class DecisionView(VerticalScroll, inherit_bindings=False):
    """The step's decision under the tree, scrolled when the window cuts it: Tab (or a click) focuses
    it, then up/down and page up/down scroll it. Only those keys: left/right, [ ] and home/end stay
    the tree view's (browse the steps)."""

    BINDINGS = [
        Binding("up", "scroll_up", "Scroll up", show=False),
        Binding("down", "scroll_down", "Scroll down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
    ]


class TokenTreeView(Vertical):
    """Browse with [ and ] (or the buttons); `follow` keeps showing the newest step."""

    BINDINGS = [
        Binding("left_square_bracket,left", "browse(-1)", "Earlier step", show=False),
        Binding("right_square_bracket,right", "browse(1)", "Later step", show=False),
        Binding("home", "jump(0)", "First step", show=False),
        Binding("end", "jump(-1)", "Newest step", show=False),
    ]

    # the legend shows in step mode (class -teaching), in one line in short windows (the chat's -short)
    SCOPED_CSS = False
    DEFAULT_CSS = """
    TokenTreeView .tree-legend { display: none; height: auto; padding: 0 1; }
    TokenTreeView #tree { scrollbar-size-horizontal: 0; }  /* a narrow panel cuts the names, the row stays the tree's */
    TokenTreeView.-teaching #tree-legend { display: block; }
    .-short TokenTreeView.-teaching #tree-legend { display: none; }
    .-short TokenTreeView.-teaching #tree-legend-short { display: block; }
    """

    index: reactive[int] = reactive(-1, always_update=True)  # the step shown; -1: none
    show_decision: reactive[bool] = reactive(False)

    @dataclass
    class Browsed(Message):
        index: int

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.events: list[StepEvent] = []
        self.follow = True
        self.greedy = True
        self.border_title = "token tree"

    def compose(self):
        with Horizontal(classes="tree-nav"):
            yield Button("◀", id="tree-prev", compact=True)
            yield Label("no step yet", id="tree-step")
            yield Button("▶", id="tree-next", compact=True)
        yield Static(legend(True), id="tree-legend", classes="tree-legend")
        yield Static(legend(True, compact=True), id="tree-legend-short", classes="tree-legend")
        yield Tree("", id="tree")
        with DecisionView(id="decision"):
            yield Static("", id="decision-text")

    def on_mount(self) -> None:
        self.query_one("#decision").display = False
        self.query_one(Tree).show_root = True

    def reset(self, greedy: bool = True) -> None:
        self.events = []
        self.follow = True
        self.greedy = greedy
        if self.is_mounted:
            self.query_one("#tree-legend", Static).update(legend(greedy))
        self.index = -1

    def add(self, event: StepEvent) -> None:
        """Record a step; the caller refreshes the view (throttled) with `sync`."""
        self.events.append(event)

    def sync(self) -> None:
        if self.follow and self.events:
            self.index = len(self.events) - 1
        elif self.index >= len(self.events):
            self.index = len(self.events) - 1

    def action_browse(self, delta: int) -> None:
        if self.events:
            target = min(max(self.index + delta, 0), len(self.events) - 1)
            self.follow = target == len(self.events) - 1
            self.index = target
            self.post_message(self.Browsed(target))

    def action_jump(self, where: int) -> None:
        if self.events:
            self.action_browse((where if where >= 0 else len(self.events) - 1) - self.index)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_browse(-1 if event.button.id == "tree-prev" else 1)

    def watch_show_decision(self, on: bool) -> None:
        self.set_class(on, "-teaching")
        if self.is_mounted:
            self.query_one("#decision").display = on
            self.watch_index(self.index)

    def watch_index(self, index: int) -> None:
        if not self.is_mounted:
            return
        tree = self.query_one(Tree)
        tree.clear()
        label = self.query_one("#tree-step", Label)
        decision = self.query_one("#decision-text", Static)
        if index < 0 or index >= len(self.events):
            tree.root.set_label(Text("waiting for the first step", style="dim"))
            label.update("no step yet")
            decision.update("")
            return
        event = self.events[index]
        label.update(f"step {event.step}  ({index + 1}/{len(self.events)})")
        self.fill(tree, event)
        if self.show_decision:
            decision.update(Text(explain(event, self.greedy)))

    def fill(self, tree: Tree, event: StepEvent) -> None:
        variables = self.app.theme_variables
        success, bonus = variables.get("success", "green"), variables.get("origin-bonus", "red")
        if not event.tree:
            what = "prefill (prompt)" if event.step == 0 else "one-token step: nothing drafted"
            tree.root.set_label(Text(what, style="bold"))
            tree.root.add_leaf(Text(f"★ {show_token(event.bonus_text)}  verifier bonus", style=f"bold {bonus}"))
            tree.root.expand()
            return
        states, tests = node_states(event, self.greedy), test_numbers(event)
        root = event.tree[0]
        tree.root.set_label(Text(f"{show_token(root.text)}  (root: last committed token)", style="bold"))
        handles = {0: tree.root}
        for node in event.tree[1:]:
            parent = handles.get(node.parent, tree.root)
            label = node_label(node, states[node.id], tests.get(node.id), success)
            handles[node.id] = parent.add(label, expand=True, allow_expand=False)
        if event.bonus_token is not None:
            last = handles[event.accepted[-1]] if event.accepted else tree.root
            last.add_leaf(Text(f"★ {show_token(event.bonus_text)}  verifier bonus", style=f"bold {bonus}"))
        tree.root.expand_all()
