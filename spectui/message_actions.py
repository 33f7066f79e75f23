"""What the keys of a focused message do (widgets/conversation.py binds them).

CopyActions, a mixin of SpecTuiApp (app.py), copies in the chat and in a replay (and f9 copies the
last answer); MessageActions, a mixin of ChatApp (chat_app.py), edits, regenerates and continues.
alt+up / alt+down move the focus between messages (screens/chat.py). Nothing here changes or
deletes a saved message's text, so nothing a user typed or saved is lost:

  c  copy the message                      b  copy its code blocks, one per press, in turn
  e  edit and resend (a message you sent): its text goes to the message box; sending it forks
     the chat: a new conversation holds copies of the messages before it, then the edited
     message and its answer. The original conversation stays as it was (F2 lists both).
     Esc, or opening another conversation, cancels the edit (the box keeps the text).
  r  regenerate (the last answer): a fork holding the messages up to the last question, which is
     sent again there; the earlier answer stays in the original conversation.
  n  continue (the last answer, meant for one cut at its token limit): the engine renders the
     answer open (no end of turn) and goes on; the saved answer is extended in place.

A fork is made only once the engine can take the turn (`turn_settings`), so a refused key leaves
no stray copy behind. A replay can be browsed and copied, not changed (ReplayApp says so).
"""

from __future__ import annotations

import re

from .widgets.conversation import AnswerBlock, ConversationView, UserBlock, code_blocks

EDIT_NOTICE = ("Editing an earlier message: enter sends it in a copy of this chat, from that message on "
               "(this chat stays as it is, in F2). Esc cancels the edit.")
FORK_SUFFIX = re.compile(r"( · (edited|regenerated))+$")


def fork_title(title: str, why: str) -> str:
    """`title · why`, without piling suffixes up on a fork of a fork."""
    return f"{FORK_SUFFIX.sub('', title)} · {why}"


class CopyActions:
    def focused_message(self, kind=(UserBlock, AnswerBlock)):
        return self.focused if isinstance(self.focused, kind) else None

    # ---- copy
    def action_copy_message(self) -> None:
        block = self.focused_message()
        if block is not None:
            self.copy_to_clipboard(block.text)
            self.notify("message copied to the clipboard")

    def action_copy_code(self) -> None:
        block = self.focused_message(AnswerBlock)
        if block is None:
            return
        found = code_blocks(block.text)
        if not found:
            self.notify("this answer has no code block", severity="warning")
            return
        index = block.code_turn % len(found)
        block.code_turn += 1
        self.copy_to_clipboard(found[index])
        self.notify(f"code block {index + 1} of {len(found)} copied" if len(found) > 1 else "code block copied")

    def action_copy_answer(self) -> None:
        answer = self.chat.last_answer()
        if not answer:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.copy_to_clipboard(answer)
        self.notify("last answer copied to the clipboard")


class MessageActions:
    edit_target: tuple[int, int, str] | None = None  # (conversation id, messages kept, its text) while an edit waits

    # ---- checks
    def is_last(self, block) -> bool:
        blocks = self.chat.query_one(ConversationView).blocks
        return bool(blocks) and blocks[-1] is block

    def busy(self, doing: str) -> bool:
        """True (and says why) when `doing` cannot start: an answer streaming, or no chat open."""
        if self.generating:
            self.notify(f"still answering: Esc stops it, then {doing}", severity="warning")
            return True
        return self.store is None or self.record is None

    # ---- edit and resend
    def action_edit_message(self) -> None:
        block = self.focused_message(UserBlock)
        if block is None or self.busy("edit"):
            return
        box = self.chat.query_one("#prompt")
        if box.text.strip() and box.text not in (block.text, self.edit_target and self.edit_target[2]):
            self.notify("the message box holds text not sent yet: send or delete it, then edit",
                        severity="warning")
            return
        users = [b for b in self.chat.query_one(ConversationView).blocks if isinstance(b, UserBlock)]
        saved = [i for i, m in enumerate(self.store.messages(self.record.id)) if m.role == "user"]
        if len(users) != len(saved):
            self.notify("this message is not saved: copy it (c) instead", severity="warning")
            return
        self.edit_target = (self.record.id, saved[users.index(block)], block.text)
        box.show(block.text)
        self.chat.set_notice(EDIT_NOTICE)

    def cancel_edit(self) -> bool:
        """Forget a waiting edit (the message box keeps its text); False when none waited."""
        if self.edit_target is None:
            return False
        self.edit_target = None
        self.chat.set_notice(None)
        return True

    async def fork_for_edit(self) -> None:
        """Sending an edited message: move to a fork of its conversation, cut before that message."""
        source, keep, _ = self.edit_target
        self.edit_target = None
        if self.record is None or self.record.id != source:
            return  # another conversation is open: an ordinary message there
        record = self.store.fork(source, keep, fork_title(self.record.title, "edited"))
        await self.open_conversation(record.id)

    # ---- regenerate and continue (the last answer)
    def last_answer_settings(self, doing: str):
        """The focused answer and the turn's settings when `doing` can start on it; else None (said why)."""
        block = self.focused_message(AnswerBlock)
        if block is None or self.busy(doing):
            return None
        if not self.is_last(block):
            self.notify(f"only the last answer can be {doing}d", severity="warning")
            return None
        return self.turn_settings()

    async def action_regenerate(self) -> None:
        settings = self.last_answer_settings("regenerate")
        if settings is None:
            return
        saved = self.store.messages(self.record.id)
        last_user = max((i for i, m in enumerate(saved) if m.role == "user"), default=None)
        if last_user is None:
            self.notify("no question to answer again", severity="warning")
            return
        record = self.store.fork(self.record.id, last_user, fork_title(self.record.title, "regenerated"))
        await self.open_conversation(record.id)
        self.chat.query_one("#prompt").focus()
        self.notify("a new answer in a copy of this chat; the earlier one stays in F2")
        await self.answer(saved[last_user].content, settings)

    async def action_continue_answer(self) -> None:
        settings = self.last_answer_settings("continue")
        if settings is None:
            return
        saved = self.store.messages(self.record.id)
        if not saved or saved[-1].role != "assistant":
            self.notify("nothing of this answer was saved to continue: r answers again", severity="warning")
            return
        await self.answer(None, settings, extends=saved[-1].id)
