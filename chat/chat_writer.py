"""The listener that saves a session's messages as they happen, and retries what failed.

A full disk or a locked database must not end the answer on screen, and must not lose
the chat either: a message whose row could not be written stays pending, and every
later event (the next flush of streamed text, the next message) tries the pending rows
again, in order, before its own. The first failure and the recovery are each reported
once through the store's `on_error` (the TUI shows them at once); the conversation is
still whole in memory meanwhile, so it can be exported from there.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING

from phasechat.chat.conversation import ChatMessage

if TYPE_CHECKING:
    from phasechat.chat.store import ChatStore

log = logging.getLogger(__name__)


class ChatWriter:
    """The SessionListener that `ChatStore.attach` adds: one per (session, chat)."""

    def __init__(self, store: ChatStore, chat_id: int) -> None:
        self.store = store
        self.chat_id = chat_id
        #: Messages added while writes failed, oldest first: inserted on the next try.
        self.pending: list[ChatMessage] = []
        #: Messages whose last update failed: rewritten whole on the next try.
        self.stale: dict[int, ChatMessage] = {}

    def message_added(self, message: ChatMessage) -> None:
        self.pending.append(message)
        self.flush()

    def message_updated(self, message: ChatMessage, final: bool) -> None:
        if any(m is message for m in self.pending):
            self.flush()  # the insert writes the message whole
            return
        self.stale[message.id] = message
        self.flush(final)

    def flush(self, final: bool = True) -> bool:
        """Write what is pending: inserts in order, then stale rows; False if a write
        still fails (it stays pending for the next try)."""
        try:
            while self.pending:
                self.store._insert(self.chat_id, self.pending[0])
                self.pending.pop(0)
            for key, message in list(self.stale.items()):
                self.store._update(self.chat_id, message, final)
                del self.stale[key]
        except sqlite3.Error as exc:
            self._failed(exc)
            return False
        self._recovered()
        return True

    def _failed(self, exc: sqlite3.Error) -> None:
        first = self.store.error is None
        self.store.error = f"chat not saved: {exc} (retrying; the chat is kept in memory)"
        log.warning("%s", self.store.error)
        if first:
            self.store.report(self.store.error, ok=False)

    def _recovered(self) -> None:
        if self.store.error is not None:
            self.store.error = None
            self.store.report("chat saved again: the writes that failed were retried", ok=True)
