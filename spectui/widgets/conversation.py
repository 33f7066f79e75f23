"""ConversationView: the chat turns. Answers stream as Markdown, or coloured by token origin.

An AnswerBlock keeps its text and its (piece, origin) list; `colour_origins` switches between
the Markdown rendering and a plain rendering where each token is coloured by its origin.
Streaming goes through Textual's MarkdownStream, which merges fragments when the widget falls
behind, and the screen only flushes a few times a second, so a fast engine never floods it.

Every message can take the focus (alt+up / alt+down, or a click); a focused message has its own
keys (BINDINGS below: copy it, copy its code blocks, edit and resend, regenerate, continue), which
the app carries out (message_actions.py). Each shows when it was sent in its title.
"""

from __future__ import annotations

import datetime as dt
import re
import time

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Markdown, Static

from .origins import origin_colour, origin_key, origin_label

WELCOME = (
    "Ask something below; the answer streams here. The side panel shows each step of the "
    "speculation: the token tree the small models drafted, the branch the verifier accepted, and how "
    "much of each tree it accepted. F1 lists every key, F5 pauses after every step, ctrl+t shows or hides the panel."
)
CONTINUE_HINT = "token limit: alt+↑ then n continues"
FENCE = re.compile(  # CommonMark: closed by a fence of the same character, at least as long
    r"^ {0,3}(?P<fence>(?P<char>[`~])(?P=char){2,})[^\n]*\n(?P<body>.*?)(?:^ {0,3}(?P=fence)(?P=char)*[ \t]*$|\Z)", re.S | re.M
)


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, without their fences (an unclosed last one runs to the end)."""
    return [match["body"].rstrip("\n") for match in FENCE.finditer(markdown)]


def stamp(created: float, now: float | None = None) -> str:
    """A message's time for its title: 14:02 today, else 3 Nov 14:02 (local time)."""
    moment = dt.datetime.fromtimestamp(created)
    today = dt.datetime.fromtimestamp(now if now is not None else time.time()).date()
    return f"{moment:%H:%M}" if moment.date() == today else f"{moment.day} {moment:%b %H:%M}"


class UserBlock(Static):
    can_focus = True
    BINDINGS = [
        Binding("c", "app.copy_message", "Copy"),
        Binding("e", "app.edit_message", "Edit & resend"),
    ]

    def __init__(self, text: str, created: float | None = None) -> None:
        super().__init__(Text(text), classes="user-turn message")
        self.text = text
        self.border_title = "you" + (f" · {stamp(created)}" if created else "")  # replays have no time


class AnswerBlock(Vertical):
    can_focus = True
    BINDINGS = [
        Binding("c", "app.copy_message", "Copy"),
        Binding("b", "app.copy_code", "Copy code"),
        Binding("r", "app.regenerate", "Regenerate"),
        Binding("n", "app.continue_answer", "Continue"),
    ]
    colour_origins: reactive[bool] = reactive(False)

    def __init__(self, text: str = "", pieces=(), ssm_names=(), live: bool = False, created: float | None = None) -> None:
        super().__init__(classes="assistant-turn message")
        self.text = text
        self.pieces: list[tuple[str, str]] = list(pieces)
        self.ssm_names = list(ssm_names)
        self._pending = ""
        self._stream = None
        self.live = live
        self.stop_reason: str | None = None  # how the answer ended in this session ("length": it can go on)
        self.code_turn = 0  # the code block `b` copies next
        self.origins_lost = False
        self.border_title = "assistant" + (f" · {stamp(created)}" if created else "")

    def compose(self):
        yield Markdown(self.text, classes="answer-md")
        yield Static("", classes="answer-coloured")

    def on_mount(self) -> None:
        self.recolour()

    def add(self, text: str, pieces) -> None:
        """Queue streamed text (drawn at the next flush)."""
        self.text += text
        self._pending += text
        if not self.origins_lost:
            self.pieces.extend(pieces)

    async def flush(self) -> None:
        if self._pending:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(Markdown))
            fragment, self._pending = self._pending, ""
            await self._stream.write(fragment)
        self.recolour()

    async def resume(self) -> None:
        """Stream again into a finished answer (it is being continued)."""
        self.live, self.stop_reason, self.border_subtitle = True, None, ""
        if "".join(piece for piece, _ in self.pieces) != self.text:
            self.origins_lost = True  # saved without origins: the continued answer is shown without them too
            self.pieces = []

    async def finish(self, stop_reason: str | None = None, can_continue: bool = False) -> None:
        """The answer ended: its subtitle says why (at the token limit, how to continue it when it can)."""
        await self.flush()
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.live = False
        self.stop_reason = stop_reason
        if stop_reason == "length":
            self.border_subtitle = CONTINUE_HINT if can_continue else "token limit"
        else:
            self.border_subtitle = stop_reason or ""

    def coloured(self) -> Text:
        out = Text()
        variables = self.app.theme_variables if self.is_attached else {}
        if not self.pieces:
            return Text(self.text)
        for piece, origin in self.pieces:
            key = origin_key(origin, self.ssm_names)
            out.append(piece, style=origin_colour(key, variables))
        return out

    def watch_colour_origins(self, on: bool) -> None:
        self.set_class(on, "-coloured")
        self.recolour()

    def recolour(self) -> None:
        """Draw the coloured rendering (when shown) in the current theme's origin colours."""
        if self.colour_origins:
            for view in self.query(".answer-coloured").results(Static):  # none before compose
                view.update(self.coloured())


class ConversationView(VerticalScroll):
    """The messages, oldest first; an empty chat shows the welcome line (not in replays)."""

    colour_origins: reactive[bool] = reactive(False)

    def __init__(self, *, welcome: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.welcome = welcome

    def on_mount(self) -> None:
        if self.welcome:
            self.mount(Static(WELCOME, id="welcome"))

    async def clear(self) -> None:
        await self.remove_children()
        if self.welcome:
            await self.mount(Static(WELCOME, id="welcome"))

    async def _add(self, block) -> None:
        for welcome in self.query("#welcome"):
            await welcome.remove()
        await self.mount(block)
        self.scroll_end(animate=False)

    async def add_user(self, text: str, created: float | None = None) -> None:
        await self._add(UserBlock(text, created))

    async def add_answer(self, text: str = "", pieces=(), ssm_names=(), live: bool = False,
                         created: float | None = None) -> AnswerBlock:
        block = AnswerBlock(text, pieces, ssm_names, live, created)
        block.colour_origins = self.colour_origins
        await self._add(block)
        return block

    @property
    def blocks(self) -> list:
        """The messages shown, oldest first."""
        return [child for child in self.children if isinstance(child, (UserBlock, AnswerBlock))]

    def select(self, delta: int, current=None) -> bool:
        """Focus the message `delta` away from `current` (None: from below the last); False at either end."""
        blocks = self.blocks
        if not blocks:
            return False
        here = blocks.index(current) if current in blocks else len(blocks)
        target = here + delta
        if not 0 <= target < len(blocks):
            return False
        # Now, not via focus() (a later turn of the loop): a key that came in the same read as
        # alt+up must already find the message focused.
        self.screen.set_focus(blocks[target], scroll_visible=False)
        self.scroll_to_widget(blocks[target], animate=False)
        return True

    def watch_colour_origins(self, on: bool) -> None:
        for block in self.query(AnswerBlock):
            block.colour_origins = on

    def recolour(self) -> None:
        for block in self.query(AnswerBlock):
            block.recolour()

    def legend(self, variables: dict[str, str], width: int = 80) -> Text:
        """The origin colours, each label in its colour; a shorter form when the view is narrow."""
        full = Text("origins:")
        short = Text()
        for key in ("ssm1", "ssm2", "ngram", "bonus"):
            style = origin_colour(key, variables)
            full.append(f" ■ {origin_label(key)}", style=style)
            short.append(f"■ {origin_label(key, short=True)} ", style=style)
        short.rstrip()
        return full if full.cell_len + 6 <= width else short  # 6: the border's corners and padding

    def show_legend(self) -> None:
        """The legend as the border subtitle while tokens are coloured by origin."""
        self.border_subtitle = self.legend(self.app.theme_variables, self.size.width) if self.colour_origins else ""

    def on_resize(self) -> None:
        self.show_legend()
