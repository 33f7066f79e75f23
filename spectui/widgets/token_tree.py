"""TokenTreeView: one verifier step's token tree, with its accepted branch, bonus and decision.

Each node shows its token, the speculators that proposed it, the draft probability q and the
verifier probability p. The accepted branch is bold in the success colour, rejected branches
are dimmed, and the bonus token (the verifier's own next token) hangs below the accepted
branch marked with a star. `explain` writes, for the teaching step mode, why each branch was
accepted or rejected. The view holds every step of the answer so earlier ones can be browsed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Button, Label, Static, Tree

from ..engine import StepEvent


def show_token(text: str) -> str:
    return repr(text)[1:-1].join("''") if text else "''"


def fmt_prob(p: float | None) -> str:
    return "-" if p is None else f"{p:.2f}"


def node_label(node, state: str, accent: str = "green") -> Text:
    sources = "+".join(node.sources) or "-"
    label = Text(show_token(node.text), style="bold" if state == "accepted" else "")
    label.append(f"  {sources}  q {fmt_prob(node.draft_prob)}  p {fmt_prob(node.verifier_prob)}")
    if state == "accepted":
        label.append("  ✓")
    label.stylize({"accepted": f"bold {accent}", "rejected": "dim"}.get(state, ""))
    return label


def explain(event: StepEvent, greedy: bool = True) -> str:
    """Why each proposed branch was accepted or rejected, one line per decision."""
    if event.step == 0:
        return f"Prefill: the verifier read the prompt and chose the first token {show_token(event.bonus_text)}."
    if len(event.tree) <= 1:
        return f"No draft this step: the verifier decoded {show_token(event.bonus_text)} on its own."
    children: dict[int, list] = {}
    for node in event.tree[1:]:
        children.setdefault(node.parent, []).append(node)
    lines, parent = [], 0
    path = list(event.accepted)
    rule = "the verifier's top token" if greedy else "kept by the sampling test min(1, p/q)"
    for depth, chosen in enumerate(path + [None], 1):
        for node in children.get(parent, []):
            who = "+".join(node.sources)
            if node.id == chosen:
                lines.append(f"✓ depth {depth}: {show_token(node.text)} ({who}) accepted: {rule}, p {fmt_prob(node.verifier_prob)}")
            elif greedy:
                lines.append(f"✗ depth {depth}: {show_token(node.text)} ({who}) rejected: not the verifier's top token (p {fmt_prob(node.verifier_prob)})")
            else:
                lines.append(f"✗ depth {depth}: {show_token(node.text)} ({who}) rejected by the test: p {fmt_prob(node.verifier_prob)} vs q {fmt_prob(node.draft_prob)}")
        if chosen is None:
            break
        parent = chosen
    if event.bonus_token is not None:
        lines.append(f"★ bonus {show_token(event.bonus_text)}: the verifier's own token after the accepted branch")
    lines.append(f"→ {len(event.new_tokens)} token(s) committed in this verifier step ({event.accepted_count}/{event.drafted} drafted accepted)")
    return "\n".join(lines)


class TokenTreeView(Vertical):
    """Browse with [ and ] (or the buttons); `follow` keeps showing the newest step."""

    BINDINGS = [
        Binding("left_square_bracket,left", "browse(-1)", "Earlier step", show=False),
        Binding("right_square_bracket,right", "browse(1)", "Later step", show=False),
        Binding("home", "jump(0)", "First step", show=False),
        Binding("end", "jump(-1)", "Newest step", show=False),
    ]

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
        yield Tree("", id="tree")
        yield Static("", id="decision")

    def on_mount(self) -> None:
        self.query_one("#decision").display = False
        self.query_one(Tree).show_root = True

    def reset(self, greedy: bool = True) -> None:
        self.events = []
        self.follow = True
        self.greedy = greedy
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
        if self.is_mounted:
            self.query_one("#decision").display = on
            self.watch_index(self.index)

    def watch_index(self, index: int) -> None:
        if not self.is_mounted:
            return
        tree = self.query_one(Tree)
        tree.clear()
        label = self.query_one("#tree-step", Label)
        decision = self.query_one("#decision", Static)
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
            tree.root.set_label(Text("prefill (prompt)", style="bold"))
            tree.root.add_leaf(Text(f"★ {show_token(event.bonus_text)}  verifier bonus", style=f"bold {bonus}"))
            tree.root.expand()
            return
        accepted = set(event.accepted)
        root = event.tree[0]
        tree.root.set_label(Text(f"{show_token(root.text)}  (root: last committed token)", style="bold"))
        handles = {0: tree.root}
        for node in event.tree[1:]:
            parent = handles.get(node.parent, tree.root)
            state = "accepted" if node.id in accepted else "rejected"
            handles[node.id] = parent.add(node_label(node, state, success), expand=True, allow_expand=False)
        if event.bonus_token is not None:
            last = handles[event.accepted[-1]] if event.accepted else tree.root
            last.add_leaf(Text(f"★ {show_token(event.bonus_text)}  verifier bonus", style=f"bold {bonus}"))
        tree.root.expand_all()
