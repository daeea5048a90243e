"""The subscriber that saves a chat's messages as they happen, and retries what failed.

A `ChatWriter` subscribes to a `TurnController` (its `MessageAdded`, `MessageUpdated` and
`BranchShown` events) and writes
through the store's public methods; the store knows nothing of it.

A full disk or a locked database must not end the answer on screen, and must not lose
the chat either: a message whose row could not be written stays pending, and every
later event (the next flush of streamed text, the next message) tries the pending rows
again, in order, before its own. The first failure and the recovery are each reported
once, as an event to the controller's subscribers (`SaveFailed`, `SaveRecovered`: the
TUI shows them at once); the conversation is still whole in memory meanwhile, so it can
be exported from there.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore
from phasechat.chat.turns import (
    ConversationWatcher,
    SaveFailed,
    SaveRecovered,
    TurnController,
)

log = logging.getLogger(__name__)


class ChatWriter(ConversationWatcher):
    """Writes one conversation to chat `chat_id` of `store`, from now on."""

    def __init__(
        self,
        store: ChatStore,
        chat_id: int,
        rows: dict[int, int] | None = None,
        report: Callable[[SaveFailed | SaveRecovered], None] | None = None,
    ) -> None:
        """`rows`: the row of each message already saved (`SavedChat.rows`); `report`:
        told when saving fails, and when it works again (`TurnController.report`)."""
        self.store = store
        self._report = report
        self.chat_id = chat_id
        self.rows: dict[int, int] = dict(rows or {})  # ChatMessage.id -> messages.id
        #: Messages added while writes failed, oldest first: inserted on the next try.
        self.pending: list[ChatMessage] = []
        #: Messages whose last update failed: rewritten whole on the next try.
        self.stale: dict[int, ChatMessage] = {}
        #: The branch to show, when that write failed: (leaf message id, system prompt).
        self.shown: tuple[int, str] | None = None

    def catch_up(self, conversation: Conversation) -> bool:
        """Write every message of `conversation` not saved yet, then which branch it
        shows; False if a write failed (it stays pending)."""
        self.pending.extend(m for m in conversation.every() if m.id not in self.rows)
        if conversation.leaf is not None:
            self.shown = (conversation.leaf, conversation.system)
        return self.flush()

    def row_of(self, message: ChatMessage) -> int | None:
        """The row `message` was saved as (None: not saved, or not yet)."""
        return self.rows.get(message.id)

    # -- what the turn controller tells -------------------------------------------------
    def message_added(self, message: ChatMessage) -> None:
        self.pending.append(message)
        self.flush()

    def message_updated(self, message: ChatMessage, final: bool) -> None:
        if any(m is message for m in self.pending):
            self.flush()  # the insert writes the message whole
            return
        self.stale[message.id] = message
        self.flush(final)

    def branch_shown(self, conversation: Conversation) -> None:
        if conversation.leaf is not None:
            self.shown = (conversation.leaf, conversation.system)
            self.flush()

    # -- writing -----------------------------------------------------------------------
    def flush(self, final: bool = True) -> bool:
        """Write what is pending: inserts in order, then stale rows, then the branch
        shown; False if a write still fails (it stays pending for the next try)."""
        store = self.store
        try:
            while self.pending:
                message = self.pending[0]
                parent = self.rows.get(message.parent) if message.parent is not None else None
                self.rows[message.id] = store.add_message(self.chat_id, message, parent)
                self.pending.pop(0)
            for key, message in list(self.stale.items()):
                row = self.rows.get(message.id)
                if row is not None:  # else a message this writer never saw added
                    store.update_message(self.chat_id, row, message, final)
                del self.stale[key]
            if self.shown is not None:
                leaf, system = self.shown
                if leaf in self.rows:
                    store.show(self.chat_id, self.rows[leaf], system)
                self.shown = None
        except sqlite3.Error as exc:
            self._failed(exc)
            return False
        self._recovered()
        return True

    def _failed(self, exc: sqlite3.Error) -> None:
        first = self.store.error is None
        error = self.store.failure(exc)
        self.store.error = f"chat not saved: {error} (retrying; the chat is kept in memory)"
        log.warning("%s", self.store.error)
        if first:
            self._tell(SaveFailed(self.store.error))

    def _recovered(self) -> None:
        if self.store.error is not None:
            self.store.error = None
            self._tell(SaveRecovered("chat saved again: the writes that failed were retried"))

    def _tell(self, event: SaveFailed | SaveRecovered) -> None:
        if self._report is not None:
            self._report(event)


def follow(
    turns: TurnController, store: ChatStore, chat_id: int, rows: dict[int, int] | None = None
) -> ChatWriter:
    """Save `turns`' conversation to chat `chat_id` from now on: what the chat lacks is
    written at once (`rows`: what it has, `SavedChat.rows`), then every change."""
    writer = ChatWriter(store, chat_id, rows, turns.report)
    writer.catch_up(turns.conversation)
    turns.subscribe(writer)
    return writer


def resume(turns: TurnController, store: ChatStore, chat_id: int) -> ChatWriter:
    """Continue saved chat `chat_id` in `turns` (its own system prompt) and save it."""
    saved = store.open_chat(chat_id)
    turns.replace_conversation(saved.conversation)
    return follow(turns, store, chat_id, saved.rows)
