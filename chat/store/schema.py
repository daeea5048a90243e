"""The chat database's schema (chats, messages, a full-text index over messages) and the
records read back from it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

SCHEMA_VERSION = 4
# Messages form a tree (`parent_id`): an edited question or a retried answer is a new
# sibling, and the old one stays. The root of a branch is its system prompt (a `system`
# message, '' for none); `chats.leaf_id` is the message the chat shows last, and
# `chats.system` the system prompt of that branch (what `phasechat chats` lists).
SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT,
    system TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    leaf_id INTEGER
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    backend TEXT,
    model TEXT,
    status TEXT NOT NULL,
    error TEXT,
    metrics TEXT,
    created REAL NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    anatomy TEXT,
    UNIQUE (chat_id, position)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""
#: Columns added since version 1, with their definitions (an older database gets them).
ADDED_COLUMNS = {
    "messages": {
        "reasoning": "TEXT NOT NULL DEFAULT ''",  # a thinking model's chain of thought (v2)
        "parent_id": "INTEGER REFERENCES messages(id) ON DELETE CASCADE",  # the tree (v3)
        "anatomy": "TEXT",  # an answer's prompt by section, JSON (v3)
    },
    "chats": {"leaf_id": "INTEGER"},  # the message shown last (v3)
}
#: Made once the columns above exist.
INDEXES = """
CREATE INDEX IF NOT EXISTS messages_parent ON messages(parent_id);
CREATE INDEX IF NOT EXISTS messages_streaming ON messages(id) WHERE status = 'streaming';
"""
# An external-content FTS5 index of the messages that are said (a finished, cancelled or
# failed one: not an answer still streaming), kept in step by triggers. A streamed
# answer's row is rewritten at each flush (chat/turns.py FLUSH_S); schema 3 re-indexed
# its whole text each time, on the UI's loop: 4-5 ms at 10,000 tokens, 23-25 ms at
# 20,000, about 5.6 s in all for a 20,000-token answer at 50 tok/s (bench.store_flush).
# Its row is indexed once, when its status leaves "streaming"; until then
# `ChatStore.search` reads it directly (a few rows, found by the partial index
# `messages_streaming`).
FTS = """
CREATE VIEW IF NOT EXISTS messages_said AS
    SELECT id, content FROM messages WHERE status != 'streaming';
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages_said', content_rowid='id'
);
CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages
WHEN new.status != 'streaming' BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages
WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_au AFTER UPDATE OF content, status ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.status != 'streaming';
    INSERT INTO messages_fts(rowid, content)
        SELECT new.id, new.content WHERE new.status != 'streaming';
END;
"""
#: Schema 3's index (of every row, streaming ones too, over the table itself): dropped,
#: then made again as FTS says and rebuilt from `messages_said`.
FTS_BEFORE_4 = """
DROP TRIGGER IF EXISTS messages_ai;
DROP TRIGGER IF EXISTS messages_ad;
DROP TRIGGER IF EXISTS messages_au;
DROP TABLE IF EXISTS messages_fts;
"""


class StoreError(Exception):
    """The chat database cannot be used (damaged, newer, unreachable): one line."""


class ChatNotFound(LookupError):
    """No chat has this id; the message is one line for a human."""

    def __init__(self, chat_id: int) -> None:
        super().__init__(f"no chat with id {chat_id}")
        self.chat_id = chat_id


@dataclass(frozen=True, slots=True)
class ChatSummary:
    """One line of the chat list. `backend`/`model` are those of the latest answer;
    a time is None when what was stored is not one (`unreadable` says so)."""

    id: int
    title: str
    system: str
    backend: str | None
    model: str | None
    messages: int
    created: datetime | None
    updated: datetime | None
    #: the chat's own cells that could not be read, one line each naming the chat
    unreadable: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601, UTC)."""
        return {
            "id": self.id,
            "title": self.title,
            "backend": self.backend,
            "model": self.model,
            "messages": self.messages,
            "created": self.created.isoformat() if self.created else None,
            "updated": self.updated.isoformat() if self.updated else None,
        }


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message that matches a search, with a one-line excerpt around the match."""

    chat_id: int
    title: str
    #: the message's id, as `chats export --format json` shows it
    message_id: int
    role: str
    snippet: str
