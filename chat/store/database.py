"""Chats on disk: SQLite in WAL mode, written as they happen.

A chat's messages form a tree (chat/conversation.py): each row names its parent, and the
chat the message it shows last. A `ChatWriter` (chat/store/writer.py), listening to a
`TurnController`, writes each new message as a row and each batch of streamed text (at
most every `chat.turns.FLUSH_S`) as an UPDATE that commits at once, so killing the
process mid-answer loses at most the text of the last flush. An answer still marked
"streaming" when a chat is loaded was cut off by a crash: `load` shows it as cancelled
with `INTERRUPTED` as its error, keeping its text.

The database holds what was said and how it was answered (backend, model, status,
metrics). No API key ever reaches it: keys live in environment variables and backends
never put them in messages.
"""

from __future__ import annotations

import errno
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phasechat.backends.untrusted import text_in
from phasechat.chat.config.paths import db_path
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store import rows as cells
from phasechat.chat.store.opening import open_readonly, open_writable
from phasechat.chat.store.rows import INTERRUPTED
from phasechat.chat.store.schema import ChatNotFound, ChatSummary, SearchHit, StoreError
from phasechat.chat.text import is_text

__all__ = [
    "INTERRUPTED",
    "TITLE_CHARS",
    "ChatNotFound",
    "ChatStore",
    "ChatSummary",
    "SavedChat",
    "SearchHit",
    "StoreError",
    "default_path",
    "default_title",
]

#: The longest default title (from the first user message).
TITLE_CHARS = 60


def default_path() -> Path:
    """Where chats live: `chats.db` in the platform's user data directory."""
    return db_path()


def default_title(text: str) -> str:
    """A chat title from its first user message: one line, at most TITLE_CHARS."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


#: SQLite's primary result codes (`sqlite_errorcode & 0xFF`) that mean a write failed,
#: and the extended codes of an I/O error that was a read
_SQLITE_FULL, _SQLITE_IOERR, _SQLITE_READONLY = 13, 10, 8
_SQLITE_IOERR_READS = (266, 522)  # SQLITE_IOERR_READ, SQLITE_IOERR_SHORT_READ
#: The errors of a disk (or a quota, or a file-size limit) that has no room left
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def failure(path: Path, exc: sqlite3.Error | OSError, *, writing: bool) -> str:
    """What a failed use of the chat database at `path` means, in one line naming the
    file. A write that failed says "cannot write" (a full disk, a failed I/O, a
    read-only file), also while opening (which writes: the schema, the WAL): only a file
    that cannot be read as a chat database says "cannot read". `writing`: the caller
    was writing, so any failure was a write's."""
    if isinstance(exc, OSError):
        if exc.errno in _FULL_ERRNOS:
            return f"cannot write {path}: {exc.strerror or exc}"
        return f"{path}: {exc.strerror or exc}"
    code = getattr(exc, "sqlite_errorcode", None) or 0
    primary = code & 0xFF
    written = primary in (_SQLITE_FULL, _SQLITE_READONLY) or (
        primary == _SQLITE_IOERR and code not in _SQLITE_IOERR_READS
    )
    if writing or written:
        return f"cannot write {path}: {exc}"
    return f"{path}: cannot read the chat database ({exc})"


class ChatStore:
    """The chat database. Safe to share between threads; each write commits."""

    def __init__(self, path: Path | str | None = None, *, readonly: bool = False) -> None:
        """Open (creating if needed) the chat database; `readonly` never writes to it
        (for reading commands: a database from a newer phasechat can still be read).

        Raises StoreError, one line, when the database cannot be used: damaged, from a
        newer phasechat (unless `readonly`), or its folder cannot be made."""
        self.path = Path(path) if path is not None else default_path()
        #: One line each: a directory or file that others could read, made private.
        self.notices: list[str] = []
        #: The last write error a listener swallowed (a full disk must not stop the chat).
        self.error: str | None = None
        self._lock = threading.RLock()
        self.readonly = readonly
        try:
            if readonly:
                self._db, self.fts = open_readonly(self.path)
            else:
                self._db, self.fts = open_writable(self.path, path is None, self.notices)
        except sqlite3.DatabaseError as exc:
            raise StoreError(failure(self.path, exc, writing=False)) from None
        except OSError as exc:
            raise StoreError(failure(self.path, exc, writing=False)) from None

    def failure(self, exc: sqlite3.Error | OSError) -> str:
        """A write to this database that failed, in one line naming the file."""
        return failure(self.path, exc, writing=True)

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the database (the WAL is checkpointed by SQLite)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def journal_mode(self) -> str:
        """The database's journal mode ("wal")."""
        with self._lock:
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    # -- chats -----------------------------------------------------------------------

    def create_chat(self, title: str | None = None, system: str = "") -> int:
        """A new, empty chat; returns its id. Without a title, the first user message
        becomes the title."""
        now = time.time()
        with self._lock, self._db:
            # One write transaction from the read of the last id to the insert: two
            # processes creating chats at once would otherwise both take the same id.
            # (SQLite waits up to the connection's timeout for the other writer.)
            self._db.execute("BEGIN IMMEDIATE")
            # Ids are never reused: a deleted chat's exports (`chat-3.md`) must not be
            # overwritten by a later chat's. The highest id ever given is kept in `counters`.
            (last,) = self._db.execute(
                "SELECT MAX(COALESCE((SELECT value FROM counters WHERE name = 'chat'), 0),"
                " COALESCE((SELECT MAX(id) FROM chats), 0))"
            ).fetchone()
            chat_id = int(last) + 1
            self._db.execute(
                "INSERT INTO chats (id, title, system, created, updated) VALUES (?, ?, ?, ?, ?)",
                (chat_id, title, system, now, now),
            )
            self._db.execute(
                "INSERT INTO counters (name, value) VALUES ('chat', ?)"
                " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (chat_id,),
            )
        return chat_id

    def _require(self, chat_id: int) -> None:
        if self._db.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is None:
            raise ChatNotFound(chat_id)

    def _summaries(self, where: str, params: tuple[Any, ...]) -> list[ChatSummary]:
        rows = self._db.execute(
            "SELECT c.id, c.title, c.system, c.created, c.updated,"
            " (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id AND m.role != 'system')"
            " AS n,"
            " (SELECT backend FROM messages m WHERE m.chat_id = c.id AND backend IS NOT NULL"
            "  ORDER BY position DESC LIMIT 1) AS backend,"
            " (SELECT model FROM messages m WHERE m.chat_id = c.id AND model IS NOT NULL"
            "  ORDER BY position DESC LIMIT 1) AS model"
            f" FROM chats c {where} ORDER BY c.updated DESC, c.id DESC",
            params,
        ).fetchall()
        return [cells.summary(r, []) for r in rows]

    def list_chats(self) -> list[ChatSummary]:
        """Every chat, most recently updated first."""
        with self._lock:
            return self._summaries("", ())

    def get(self, chat_id: int) -> ChatSummary:
        """One chat's summary; raises ChatNotFound."""
        with self._lock:
            found = self._summaries("WHERE c.id = ?", (chat_id,))
        if not found:
            raise ChatNotFound(chat_id)
        return found[0]

    def load(self, chat_id: int) -> Conversation:
        """The chat as a Conversation, every branch of it (raises ChatNotFound).

        An answer still marked "streaming" was cut off by a crash (or is being written by
        another process right now): it comes back "cancelled", its error `INTERRUPTED`.
        """
        return self.open_chat(chat_id).conversation

    def open_chat(self, chat_id: int) -> SavedChat:
        """The chat (as `load`) with the row of each of its messages, to go on writing it."""
        with self._lock:
            chat = self._db.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
            if chat is None:
                raise ChatNotFound(chat_id)
            rows = self._db.execute(
                "SELECT * FROM messages WHERE chat_id = ? ORDER BY position, id", (chat_id,)
            ).fetchall()
        notes: list[str] = []
        ids: dict[int, int] = {}  # row -> message id
        messages: list[ChatMessage] = []
        if rows and "parent_id" not in rows[0].keys():  # noqa: SIM118 (a Row: `in` looks at values)
            # a database from before branches, read-only: one branch under its system prompt
            system = cells.Cells(f"chat {chat_id}", notes).text(chat["system"], "system prompt")
            messages.append(ChatMessage("system", system or ""))
        for r in rows:
            message = cells.message(r, chat_id, notes)
            if "parent_id" in r.keys():  # noqa: SIM118
                message.parent = ids.get(r["parent_id"])
            elif messages:
                message.parent = messages[-1].id
            ids[r["id"]] = message.id
            messages.append(message)
        leaf = chat["leaf_id"] if "leaf_id" in chat.keys() else None  # noqa: SIM118
        conversation = Conversation.from_tree(messages, ids.get(leaf) if leaf else None)
        return SavedChat(chat_id, conversation, {m: r for r, m in ids.items()}, tuple(notes))

    def rename(self, chat_id: int, title: str) -> None:
        """Give a chat a new title (raises ChatNotFound, or ValueError when blank)."""
        title = " ".join(title.split())
        if not is_text(title):
            raise ValueError("the title is not valid UTF-8: not renamed")
        if not title:
            raise ValueError("a chat title cannot be empty")
        with self._lock, self._db:
            self._require(chat_id)
            self._db.execute(
                "UPDATE chats SET title = ?, updated = ? WHERE id = ?",
                (title, time.time(), chat_id),
            )

    def delete(self, chat_id: int) -> None:
        """Delete a chat and its messages (raises ChatNotFound)."""
        with self._lock:
            with self._db:
                self._require(chat_id)
                self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
                if self.fts:
                    # The index keeps deleted words in old segments until they merge:
                    # merge them all now, so (with secure_delete) the words are gone.
                    self._db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
            # ...and from the WAL, which still holds the pages as they were.
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
        """Messages whose content matches every word of `text` (FTS5: word prefixes;
        without FTS5: the whole text as a substring), newest chats first. An answer still
        streaming (or cut off by a crash) is not in the index yet: it matches when it
        holds every word (case-insensitive, as a substring)."""
        words = text.split()
        if not words:
            return []
        select = (
            "SELECT m.chat_id, m.id, m.role, m.content, c.title, c.updated, m.position"
            " FROM messages m JOIN chats c ON c.id = m.chat_id"
        )
        order = " ORDER BY 6 DESC, 7 LIMIT ?"
        with self._lock:
            if self.fts:
                # Each word quoted (no FTS syntax from the user) and prefix-matched.
                query = " ".join('"' + w.replace('"', '""') + '"*' for w in words)
                each = " AND ".join("m.content LIKE ? ESCAPE '\\'" for _ in words)
                rows = self._db.execute(
                    f"{select} JOIN messages_fts f ON f.rowid = m.id WHERE messages_fts MATCH ?"
                    f" AND m.status != 'streaming'"  # a schema-3 index, read-only, has them
                    f" UNION ALL {select} WHERE m.status = 'streaming' AND {each}{order}",
                    (query, *(f"%{_like(w)}%" for w in words), limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"{select} WHERE m.content LIKE ? ESCAPE '\\'{order}",
                    (f"%{_like(text)}%", limit),
                ).fetchall()
        return [_hit(r, words) for r in rows]

    # -- writing a chat as it happens (chat/store/writer.py) ----------------------------

    def add_message(self, chat_id: int, m: ChatMessage, parent_row: int | None) -> int:
        """Write a new message of chat `chat_id` after row `parent_row` (None: a root);
        the chat shows it now. Returns its row."""
        now = time.time()
        with self._lock, self._db:
            # The position is the chat's next one at the moment of writing, so two windows
            # on one chat both save their messages (as two branches) instead of colliding.
            cur = self._db.execute(
                "INSERT INTO messages (chat_id, position, role, content, backend, model,"
                " status, error, metrics, created, reasoning, parent_id, anatomy) VALUES (?,"
                " (SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE chat_id = ?),"
                " ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    chat_id,
                    chat_id,
                    m.role,
                    m.content,
                    m.backend,
                    m.model,
                    m.status,
                    m.error,
                    _metrics_json(m),
                    now,
                    m.reasoning,
                    parent_row,
                    _anatomy_json(m),
                ),
            )
            assert cur.lastrowid is not None
            if m.role == "user":
                self._db.execute(
                    "UPDATE chats SET title = ? WHERE id = ? AND title IS NULL",
                    (default_title(m.content), chat_id),
                )
            self._db.execute(
                "UPDATE chats SET updated = ?, leaf_id = ? WHERE id = ?",
                (now, cur.lastrowid, chat_id),
            )
            if m.role == "system":
                self._db.execute("UPDATE chats SET system = ? WHERE id = ?", (m.content, chat_id))
        return cur.lastrowid

    def update_message(self, chat_id: int, row: int, m: ChatMessage, final: bool) -> None:
        """Rewrite message `row` of chat `chat_id`: its text (while it streams), or all
        of it (`final`)."""
        now = time.time()
        with self._lock, self._db:
            if final:
                self._db.execute(
                    "UPDATE messages SET content = ?, model = ?, status = ?, error = ?,"
                    " metrics = ?, reasoning = ?, anatomy = ? WHERE id = ?",
                    (
                        m.content,
                        m.model,
                        m.status,
                        m.error,
                        _metrics_json(m),
                        m.reasoning,
                        _anatomy_json(m),
                        row,
                    ),
                )
                if m.role == "system":  # an empty chat's system prompt, changed
                    self._db.execute(
                        "UPDATE chats SET system = ? WHERE id = ? AND leaf_id = ?",
                        (m.content, chat_id, row),
                    )
            else:  # the hot path while text streams: only the text changes
                self._db.execute(
                    "UPDATE messages SET content = ?, reasoning = ? WHERE id = ?",
                    (m.content, m.reasoning, row),
                )
            self._db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))

    def show(self, chat_id: int, leaf_row: int, system: str) -> None:
        """Chat `chat_id` shows the branch ending at `leaf_row`, whose system prompt is
        `system`."""
        with self._lock, self._db:
            self._db.execute(
                "UPDATE chats SET leaf_id = ?, system = ?, updated = ? WHERE id = ?",
                (leaf_row, system, time.time(), chat_id),
            )


@dataclass(frozen=True, slots=True)
class SavedChat:
    """A saved chat as loaded: its conversation, and the row of each message
    (`ChatMessage.id` -> `messages.id`) for writing more of it."""

    chat_id: int
    conversation: Conversation
    rows: dict[int, int]
    #: each cell that could not be read, one line naming the chat and the message
    unreadable: tuple[str, ...] = ()


def _hit(r: sqlite3.Row, words: list[str]) -> SearchHit:
    """A search result row as a hit; a title or content that cannot be read is named."""
    chat_id = int(r["chat_id"])
    title, role = r["title"], r["role"]
    if title is not None and text_in(title) is None:
        title = "(unreadable title)"
    role = text_in(role) or "unknown"
    content = cells.snippet_source(r["content"], chat_id, r["id"])
    return SearchHit(chat_id, title or "(untitled)", r["id"], role, _snippet(content, words))


def _like(text: str) -> str:
    """`text` escaped for a LIKE pattern (ESCAPE '\\'): its `%` and `_` are themselves."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _anatomy_json(m: ChatMessage) -> str | None:
    return json.dumps(m.anatomy.as_dict()) if m.anatomy is not None else None


def _metrics_json(m: ChatMessage) -> str | None:
    return json.dumps(m.metrics.as_dict()) if m.metrics is not None else None


def _snippet(content: str, words: list[str], width: int = 80) -> str:
    """One line of `content` around the first word found (case-insensitive)."""
    flat = " ".join(content.split())
    low = flat.lower()
    hits = [i for i in (low.find(w.lower()) for w in words) if i >= 0]
    start = max(0, min(hits, default=0) - width // 4)
    text = flat[start : start + width]
    return ("…" if start else "") + text + ("…" if start + width < len(flat) else "")
