"""ConversationView: the chat turns. Answers stream as Markdown, or coloured by token origin.

An AnswerBlock keeps its text and its (piece, origin) list; `colour_origins` switches between
the Markdown rendering and a plain rendering where each token is coloured by its origin.
Streaming goes through Textual's MarkdownStream, which merges fragments when the widget falls
behind, and the screen only flushes a few times a second, so a fast engine never floods it.
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Markdown, Static

from .origins import origin_colour, origin_key, origin_label


class UserBlock(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="user-turn")
        self.border_title = "you"


class AnswerBlock(Vertical):
    colour_origins: reactive[bool] = reactive(False)

    def __init__(self, text: str = "", pieces=(), ssm_names=(), live: bool = False) -> None:
        super().__init__(classes="assistant-turn")
        self.text = text
        self.pieces: list[tuple[str, str]] = list(pieces)
        self.ssm_names = list(ssm_names)
        self._pending = ""
        self._stream = None
        self.live = live
        self.border_title = "assistant"

    def compose(self):
        yield Markdown(self.text, classes="answer-md")
        yield Static("", classes="answer-coloured")

    def on_mount(self) -> None:
        self.recolour()

    def add(self, text: str, pieces) -> None:
        """Queue streamed text (drawn at the next flush)."""
        self.text += text
        self._pending += text
        self.pieces.extend(pieces)

    async def flush(self) -> None:
        if self._pending:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(Markdown))
            fragment, self._pending = self._pending, ""
            await self._stream.write(fragment)
        self.recolour()

    async def finish(self, note: str | None = None) -> None:
        await self.flush()
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.live = False
        if note:
            self.border_subtitle = note

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
    colour_origins: reactive[bool] = reactive(False)

    async def clear(self) -> None:
        await self.remove_children()

    async def add_user(self, text: str) -> None:
        await self.mount(UserBlock(text))
        self.scroll_end(animate=False)

    async def add_answer(self, text: str = "", pieces=(), ssm_names=(), live: bool = False) -> AnswerBlock:
        block = AnswerBlock(text, pieces, ssm_names, live)
        block.colour_origins = self.colour_origins
        await self.mount(block)
        self.scroll_end(animate=False)
        return block

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
