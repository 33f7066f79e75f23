"""A chat turn read on its own thread, so that a test can watch the engine pause (step mode) and go on."""

from __future__ import annotations

import threading
import time

from spectui.engine.chat import Conversation


def ask(text: str) -> Conversation:
    conversation = Conversation()
    conversation.add("user", text)
    return conversation


class BackgroundTurn:
    """worker.chat(conversation, settings) consumed on a daemon thread; `events` grows as steps arrive."""

    def __init__(self, worker, conversation: Conversation, settings):
        self.events: list = []
        self.done = threading.Event()
        threading.Thread(target=self._read, args=(worker, conversation, settings), daemon=True).start()

    def _read(self, worker, conversation, settings) -> None:
        try:
            for event in worker.chat(conversation, settings):
                self.events.append(event)
        finally:
            self.done.set()

    def wait_for(self, count: int, timeout_s: float) -> int:
        """Wait until `count` events arrived (or the timeout); -> how many there are."""
        deadline = time.monotonic() + timeout_s
        while len(self.events) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.events)

    def count_after(self, settle_s: float) -> int:
        """How many events there are after `settle_s` more seconds: a paused turn's count does not grow."""
        time.sleep(settle_s)
        return len(self.events)
