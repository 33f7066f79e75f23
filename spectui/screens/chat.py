"""ChatScreen: conversation and input on the left, token tree and acceptance on the right.

The chat has priority in small windows: below NARROW_BELOW columns the side panel hides, except
in step mode (whose point is the tree), and then takes half the width; ctrl+t shows or hides it
at any width, and that choice holds until the window crosses the NARROW_BELOW line.

The screen only draws; the app decides what happens. Every StepEvent, live or replayed, goes
through `add_step`; drawing is throttled under a CPU budget (`redraw_tick`), except in step mode
where each step is drawn as it comes, so rendering never holds up the engine.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..engine import StepEvent
from ..widgets.acceptance import AcceptancePanel
from ..widgets.conversation import AnswerBlock, ConversationView
from ..widgets.origins import token_pieces
from ..widgets.prompt import PromptInput
from ..widgets.status import StatusLine
from ..widgets.token_tree import TokenTreeView

# Redraws while streaming are paced by the UI's own CPU use, because on a small machine every
# millisecond of layout and drawing is taken from the engine (docs/tui.md, Performance). After a
# redraw, the next one waits until the UI thread has used at most REDRAW_CPU_SHARE of a core since
# the last one:  cpu_used <= share * elapsed,  never sooner than TEXT_FLUSH_S and never later than
# MAX_WAIT_S. The tree and the chart are redrawn at most every PANEL_FLUSH_S.
TICK_S = 0.1
TEXT_FLUSH_S = 0.5
PANEL_FLUSH_S = 1.0
MAX_WAIT_S = 2.0
REDRAW_CPU_SHARE = 0.04
NARROW_BELOW = 100  # columns: a narrower window hides the side panel unless step mode or ctrl+t shows it


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.stop", "Stop", priority=True),
        Binding("f1", "app.help", "Help"),
        Binding("f2", "app.conversations", "Chats"),
        Binding("f3", "app.settings", "Settings"),
        Binding("ctrl+o", "app.pick_model", "Model", show=False),
        Binding("f4", "app.toggle_origins", "Origins"),
        Binding("f5", "app.toggle_step_mode", "Step mode"),
        Binding("f6", "app.next_step", "Next step", priority=True),  # priority: TextArea binds f6/f7
        Binding("f7", "browse(-1)", "◀ step", show=False, priority=True),
        Binding("f8", "browse(1)", "step ▶", show=False, priority=True),
        Binding("f9", "app.copy_answer", "Copy", show=False),
        Binding("ctrl+t", "toggle_panel", "Panel"),
        Binding("alt+up", "select_message(-1)", "Messages", show=False, priority=True),
        Binding("alt+down", "select_message(1)", "Messages", show=False, priority=True),
        Binding("ctrl+n", "app.new_conversation", "New chat", show=False),
        Binding("ctrl+r", "app.search_prompts", "Search prompts", show=False),
        Binding("ctrl+e", "app.restart_engine", "Restart engine", show=False, priority=True),  # after the engine process stopped
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]  # CSS: the panel's width
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]  # CSS: a smaller chart in short windows

    def __init__(self, replay: bool = False) -> None:
        super().__init__()
        self.replay = replay
        self.answer: AnswerBlock | None = None
        self.ssm_names: list[str] = []
        self.dirty = False  # text waiting to be drawn
        self.panels_dirty = False  # steps the tree and the chart have not drawn yet
        self.step_mode = False
        self.panel_choice: bool | None = None  # ctrl+t's choice; None: by width and step mode
        self.was_narrow: bool | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield ConversationView(id="conversation", welcome=not self.replay)
                yield Static("", id="notice")
                if self.replay:
                    yield Static("", id="replay-bar")
                else:
                    yield PromptInput(id="prompt", placeholder="Ask something — enter sends, ctrl+j or alt+enter adds a line")
            with Vertical(id="right"):
                yield TokenTreeView(id="tree-view")
                yield AcceptancePanel(id="acceptance")
        yield StatusLine(live_memory=not self.replay, id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#notice").display = False
        self.redrawn_at, self.redrawn_cpu, self.panels_at = time.monotonic(), time.thread_time(), 0.0
        self.set_interval(TICK_S, self.redraw_tick)
        if not self.replay:
            self.query_one(PromptInput).focus()
        self.layout_panel()

    def on_resize(self) -> None:
        narrow = self.size.width < NARROW_BELOW
        if self.was_narrow is not None and narrow != self.was_narrow:
            self.panel_choice = None  # across the 100-column line the layout starts afresh
        self.was_narrow = narrow
        self.layout_panel()

    # conversation
    async def show_history(self, messages, ssm_names) -> None:
        """Replace the conversation with stored messages; the tree and chart start empty."""
        view = self.query_one(ConversationView)
        await view.clear()
        self.answer = None
        for message in messages:
            if message.role == "user":
                await view.add_user(message.content, message.created)
            elif message.role == "assistant":  # numbered by the speculators that drafted it, when saved
                await view.add_answer(message.content, message.origins, message.speculators or ssm_names,
                                      created=message.created)
        self.query_one(TokenTreeView).reset()
        self.query_one(AcceptancePanel).reset()

    async def begin_turn(self, prompt: str | None, ssm_names: list[str], greedy: bool, quant: str,
                         created: float | None = None) -> None:
        """A new answer to `prompt` (None: the last answer goes on; `created`: when, None in replays)."""
        view = self.query_one(ConversationView)
        self.ssm_names = list(ssm_names)
        if prompt is None and view.blocks and isinstance(view.blocks[-1], AnswerBlock):
            self.answer = view.blocks[-1]
            await self.answer.resume()
        else:
            await view.add_user(prompt, created)
            self.answer = await view.add_answer(ssm_names=ssm_names, live=True, created=created)
        self.query_one(TokenTreeView).reset(greedy)
        panel = self.query_one(AcceptancePanel)
        panel.quant = quant
        panel.reset()

    def add_step(self, event: StepEvent) -> None:
        if self.answer is not None:
            self.answer.add(event.new_text, token_pieces(event))
        self.query_one(TokenTreeView).add(event)
        self.query_one(AcceptancePanel).add(event)
        if event.notice:
            self.notify(event.notice, severity="warning")
        self.dirty = self.panels_dirty = True

    async def redraw_tick(self) -> None:
        """Redraw what streamed in, within the UI's CPU budget (see REDRAW_CPU_SHARE)."""
        now, cpu = time.monotonic(), time.thread_time()
        if not (self.dirty or self.panels_dirty):
            self.redrawn_at, self.redrawn_cpu = now, cpu  # idle: the budget starts afresh
            return
        elapsed = now - self.redrawn_at
        if elapsed < TEXT_FLUSH_S or (cpu - self.redrawn_cpu > REDRAW_CPU_SHARE * elapsed and elapsed < MAX_WAIT_S):
            return
        await self.flush_text()
        if now - self.panels_at >= PANEL_FLUSH_S:
            self.flush_panels()
            self.panels_at = now
        self.redrawn_at, self.redrawn_cpu = now, cpu

    async def flush(self) -> None:
        """Draw everything now (step mode, replay, end of a turn)."""
        await self.flush_text()
        self.flush_panels()

    async def flush_text(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        if self.answer is not None:
            await self.answer.flush()
            view = self.query_one(ConversationView)
            if self.answer.live and view.max_scroll_y - view.scroll_y > 0:
                view.scroll_end(animate=False)

    def flush_panels(self) -> None:
        if not self.panels_dirty:
            return
        self.panels_dirty = False
        self.query_one(TokenTreeView).sync()
        self.query_one(AcceptancePanel).sync()

    async def end_turn(self, stop_reason: str | None = None) -> None:
        self.dirty = self.panels_dirty = True
        await self.flush()
        if self.answer is not None:
            await self.answer.finish(stop_reason, can_continue=not self.replay)
            self.answer = None

    def last_answer(self) -> str | None:
        blocks = list(self.query(AnswerBlock))
        return blocks[-1].text if blocks else None

    # view state
    def set_notice(self, text: str | None, error: bool = False) -> None:
        notice = self.query_one("#notice", Static)
        notice.display = bool(text)
        notice.set_class(error, "error")
        notice.update(Text(text or ""))

    def set_step_mode(self, on: bool) -> None:
        self.step_mode = on
        self.set_class(on, "-step")  # CSS: the tree and its explanation get the room
        self.query_one(TokenTreeView).show_decision = on
        self.layout_panel()

    @property
    def panel_shown(self) -> bool:
        if self.panel_choice is not None:
            return self.panel_choice
        return self.step_mode or self.size.width >= NARROW_BELOW

    def layout_panel(self) -> None:
        self.query_one("#right").display = self.panel_shown

    def action_toggle_panel(self) -> None:
        self.panel_choice = not self.panel_shown
        self.layout_panel()

    def set_colour_origins(self, on: bool) -> None:
        view = self.query_one(ConversationView)
        view.colour_origins = on
        view.recolour()
        view.show_legend()

    def action_select_message(self, delta: int) -> None:
        """alt+up / alt+down: the message above or below the focused one (from the box: the last one);
        below the last message, back to the message box."""
        if not self.query_one(ConversationView).select(delta, self.focused) and delta > 0 and not self.replay:
            self.set_focus(self.query_one(PromptInput))

    def action_browse(self, delta: int) -> None:
        self.query_one(TokenTreeView).action_browse(delta)

    def set_replay_bar(self, text: str) -> None:
        if self.replay:
            self.query_one("#replay-bar", Static).update(text)

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)


class ReplayScreen(ChatScreen):
    """The chat screen for `spectui replay`: no input, and play/pause/step/speed keys."""

    BINDINGS = [
        Binding("space", "app.replay_toggle", "Play/pause"),
        Binding("n", "app.next_step", "Step", priority=True),  # before a focused answer's n (continue)
        Binding("plus,equals_sign", "app.replay_speed(2.0)", "Faster"),
        Binding("minus", "app.replay_speed(0.5)", "Slower"),
    ]

    def __init__(self) -> None:
        super().__init__(replay=True)
