"""HistoryActions: the chat's conversation commands (open, new, rename, delete, export) and
the prompt history (Up/Down in the message box, ctrl+r to search it).

A mixin of ChatApp (chat_app.py), which holds `store`, `record`, `chat` and `generating`. What a
conversation command does to a streaming answer: it stops the answer, which is saved as far as
it streamed when its turn ends (`TurnFinished`), and then acts (`after_turn`); so ctrl+n, F2
→ open and deleting the open conversation work while an answer streams and lose nothing. A
conversation is deleted only after the user confirms it in a dialog.
"""

from __future__ import annotations

from functools import partial

from . import paths
from .screens.dialogs import ConfirmScreen, ConversationsScreen, TextPromptScreen
from .screens.prompt_search import PromptSearchScreen
from .store import export_file


class HistoryActions:
    pending = None  # the coroutine function to run once the streaming answer has stopped and been saved

    # ---- prompt history
    def refresh_prompt_history(self) -> None:
        """The message box's Up/Down history: every prompt sent, in any conversation (the store's)."""
        if self.store is not None:
            self.chat.query_one("#prompt").sent = self.store.user_prompts()

    def action_search_prompts(self) -> None:
        if self.store is None:
            return
        box = self.chat.query_one("#prompt")
        self.push_screen(PromptSearchScreen(box.sent), lambda text: text and box.show(text))  # refreshed on every send

    # ---- acting on a streaming answer
    async def after_turn(self, action, doing: str) -> None:
        """Run `action` now, or stop the streaming answer and run it once that answer is saved."""
        if not self.generating:
            await action()
            return
        self.pending = action
        self.notify(f"stopping the answer to {doing}; what it streamed is saved")
        self.action_stop()

    async def run_pending(self) -> None:
        """Called when a turn has ended and its answer is saved."""
        action, self.pending = self.pending, None
        if action is not None:
            await action()

    # ---- conversations
    async def open_conversation(self, conversation_id: int) -> None:
        self.cancel_edit()  # an edit waiting in the message box belonged to the conversation left
        self.record = self.store.get(conversation_id)
        self.store.set_last(conversation_id)
        names = self.info.speculators if self.info else []
        await self.chat.show_history(self.store.messages(conversation_id), names)
        self.chat.sub_title = self.record.title
        self.sub_title = self.record.title

    async def action_new_conversation(self) -> None:
        if self.store is None:
            return
        if self.generating:
            await self.after_turn(self.action_new_conversation, "start a new conversation")
            return
        self.record = self.store.create(system=self.system_override)
        await self.open_conversation(self.record.id)

    def action_conversations(self) -> None:
        if self.store is None:
            return
        current = self.record.id if self.record else None
        self.push_screen(ConversationsScreen(self.store.list(), current), self.on_conversation_choice)

    async def on_conversation_choice(self, choice) -> None:
        if not choice:
            return
        what, target = choice
        if what == "new":
            await self.action_new_conversation()
        elif what == "open":
            if not (self.record and self.record.id == target):
                await self.after_turn(partial(self.open_conversation, target), "open that conversation")
        elif what == "rename":
            self.push_screen(TextPromptScreen("New title", self.store.get(target).title), partial(self.renamed, target))
        elif what == "delete":
            record = self.store.get(target)
            count = len(self.store.messages(target))
            question = f"Delete “{record.title}” and its {count} message{'s' * (count != 1)}? This cannot be undone."
            self.push_screen(ConfirmScreen(question, "Delete"), partial(self.delete_confirmed, target))

    async def renamed(self, target: int, title: str | None) -> None:
        if title:
            self.store.rename(target, title)
            if self.record and self.record.id == target:
                self.record.title = self.sub_title = title
        self.action_conversations()

    async def delete_confirmed(self, target: int, confirmed: bool) -> None:
        if not confirmed:
            self.action_conversations()
            return
        if self.generating and self.record and self.record.id == target:
            await self.after_turn(partial(self.delete_conversation, target), "delete its conversation")
        else:
            await self.delete_conversation(target)

    async def delete_conversation(self, target: int) -> None:
        self.store.delete(target)
        if self.record and self.record.id == target:
            self.record = self.store.last()
            if self.record:
                await self.open_conversation(self.record.id)
            else:
                await self.chat.show_history([], [])
        self.notify("conversation deleted")
        self.action_conversations()

    # ---- export
    def action_export(self) -> None:
        if self.store is None or self.record is None:
            self.notify("nothing to export yet", severity="warning")
            return
        try:
            target = export_file(paths.exports_dir(), self.record, self.store.messages(self.record.id))
        except OSError as exc:
            self.notify(f"cannot export to {paths.exports_dir()}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"exported to {target}")
