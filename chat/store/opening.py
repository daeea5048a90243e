"""Opening the chat database: for writing (created private, schema applied, never over a
newer phasechat's schema) or read-only (never written, so a newer database is read as
it is, and a read-only folder still lists and exports).

Both return the connection and whether the full-text index is there.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from phasechat.chat.config.paths import private_dir, private_file
from phasechat.chat.store.schema import (
    ADDED_COLUMNS,
    FTS,
    INDEXES,
    SCHEMA,
    SCHEMA_VERSION,
    StoreError,
)


def open_readonly(path: Path) -> tuple[sqlite3.Connection, bool]:
    """`path` opened read-only; an empty in-memory store when nothing was saved yet."""
    if not path.is_file():
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.executescript(SCHEMA)
        return db, False
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    db = sqlite3.connect(uri, uri=True, timeout=10, check_same_thread=False)
    db.row_factory = sqlite3.Row
    try:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.OperationalError:
        # A WAL database in a read-only folder: SQLite cannot make its -shm file.
        # Closed cleanly it has no WAL to miss, so read it as an immutable file.
        db.close()
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size:
            raise
        db = sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False)
        db.row_factory = sqlite3.Row
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    if "chats" not in names:
        db.close()
        raise StoreError(f"{path}: not a phasechat chat database")
    return db, "messages_fts" in names


def open_writable(path: Path, ours: bool, notices: list[str]) -> tuple[sqlite3.Connection, bool]:
    """`path` opened for writing, created 0600 (in a 0700 folder when `ours`); a line
    goes to `notices` for each file or folder that had to be made private."""
    if ours:  # our own data directory: private (an explicit path is the caller's)
        _notice(notices, private_dir(path.parent))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Created private: SQLite gives its -wal and -shm files the database's mode.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    # check_same_thread=False: the TUI may read from a worker thread; the store serialises.
    db = sqlite3.connect(path, timeout=10, check_same_thread=False)
    try:
        fts = _prepare(db, path)
    except BaseException:
        db.close()
        raise
    # Chats are private: a database or WAL file left readable by an older version
    # (or a copy) is made 0600.
    for suffix in ("", "-wal", "-shm"):
        _notice(notices, private_file(path.with_name(path.name + suffix)))
    return db, fts


def _notice(notices: list[str], line: str | None) -> None:
    if line:
        notices.append(line)


def _prepare(db: sqlite3.Connection, path: Path) -> bool:
    db.row_factory = sqlite3.Row
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        # Writing our older schema over it would silently downgrade the user's chats.
        raise StoreError(
            f"{path} is from a newer phasechat (schema {version}, this one knows"
            f" {SCHEMA_VERSION}): upgrade phasechat; `phasechat chats` can still read it"
        )
    db.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL survives a killed process (not a power cut) at a fraction of FULL's cost.
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA foreign_keys=ON")
    # Delete means gone: freed pages are zeroed, not left holding deleted words.
    db.execute("PRAGMA secure_delete=ON")
    fts = False
    with db:
        db.executescript(SCHEMA)
        for table, columns in ADDED_COLUMNS.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for name, definition in columns.items():
                if name not in have:  # a database from an older version
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
        db.executescript(INDEXES)
        if version < 3:
            _into_trees(db)
        try:
            db.executescript(FTS)
            fts = True
        except sqlite3.OperationalError:  # an SQLite built without FTS5: LIKE instead
            fts = False
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    return fts


def _into_trees(db: sqlite3.Connection) -> None:
    """Schema 2 -> 3, in the caller's transaction: each chat's messages, a list in
    `position` order, become one branch under a root holding the chat's system prompt,
    and the chat shows its last message. Nothing is rewritten twice: only chats with
    no root yet (no message has a parent and none is a system prompt) are converted."""
    chats = db.execute("SELECT id, system, created FROM chats").fetchall()
    for chat_id, system, created in chats:
        rows = db.execute(
            "SELECT id, role, parent_id FROM messages WHERE chat_id = ? ORDER BY position",
            (chat_id,),
        ).fetchall()
        if any(r[1] == "system" or r[2] is not None for r in rows):
            continue
        (first,) = db.execute(
            "SELECT COALESCE(MIN(position), 0) FROM messages WHERE chat_id = ?", (chat_id,)
        ).fetchone()
        parent = db.execute(
            "INSERT INTO messages (chat_id, position, role, content, status, created)"
            " VALUES (?, ?, 'system', ?, 'complete', ?)",
            (chat_id, first - 1, system or "", created),
        ).lastrowid
        for row_id, _role, _parent in rows:
            db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (parent, row_id))
            parent = row_id
        db.execute("UPDATE chats SET leaf_id = ? WHERE id = ?", (parent, chat_id))
