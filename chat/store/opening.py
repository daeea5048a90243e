"""Opening the chat database: for writing (created private, schema applied, never over a
newer phasechat's schema) or read-only (never written, so a newer database is read as
it is, and a read-only folder still lists and exports).

Both return the connection and whether the full-text index is there, and both read
TEXT with `rows.text_factory` (a cell that is not UTF-8 is checked where it is read,
not a failed query).

Opening for writing brings an older database up to this schema in one transaction:
all of it or none of it. A migration that fails half way leaves the file as it was, at
its old `user_version`, still readable by this phasechat (read-only) and the old one.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from phasechat.chat.config.paths import private_dir, private_file
from phasechat.chat.store.rows import text_factory
from phasechat.chat.store.schema import (
    ADDED_COLUMNS,
    FTS,
    FTS_BEFORE_4,
    INDEXES,
    SCHEMA,
    SCHEMA_VERSION,
    StoreError,
)


def open_readonly(path: Path) -> tuple[sqlite3.Connection, bool]:
    """`path` opened read-only; an empty in-memory store when nothing was saved yet."""
    if not path.is_file():
        db = _connect(":memory:")
        db.executescript(SCHEMA)
        return db, False
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    db = _connect(uri, uri=True, timeout=10)
    try:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.OperationalError:
        # A WAL database in a read-only folder: SQLite cannot make its -shm file.
        # Closed cleanly it has no WAL to miss, so read it as an immutable file.
        db.close()
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size:
            raise
        db = _connect(uri + "&immutable=1", uri=True)
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
    db = _connect(str(path), timeout=10)
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


def _connect(target: str, *, uri: bool = False, timeout: float = 5.0) -> sqlite3.Connection:
    # check_same_thread=False: the TUI may read from a worker thread; the store serialises.
    db = sqlite3.connect(target, uri=uri, timeout=timeout, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.text_factory = text_factory
    return db


def _notice(notices: list[str], line: str | None) -> None:
    if line:
        notices.append(line)


def _prepare(db: sqlite3.Connection, path: Path) -> bool:
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
    # The transaction is ours: the sqlite3 module's own would commit before each
    # `executescript` and leave every ALTER TABLE committed as it ran.
    legacy = db.isolation_level
    db.isolation_level = None
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            fts = _upgrade(db, version)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # (SQLite has rolled back already after some errors)
                db.execute("ROLLBACK")
            raise
    finally:
        db.isolation_level = legacy
    return fts


def _upgrade(db: sqlite3.Connection, version: int) -> bool:
    """The schema made current, in the caller's transaction; whether FTS5 is there."""
    for statement in _statements(SCHEMA):
        db.execute(statement)
    for table, columns in ADDED_COLUMNS.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in columns.items():
            if name not in have:  # a database from an older version
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
    for statement in _statements(INDEXES):
        db.execute(statement)
    if version < 3:
        _into_trees(db)
    try:
        if version < 4:  # schema 3 indexed streaming rows too: the index is made again
            for statement in _statements(FTS_BEFORE_4):
                db.execute(statement)
        for statement in _statements(FTS):
            db.execute(statement)
        if version < 4:
            db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
    except sqlite3.OperationalError:  # an SQLite built without FTS5: LIKE instead
        return False
    return True


def _statements(script: str) -> list[str]:
    """`script`'s statements one by one (a trigger's body keeps its own semicolons)."""
    out, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    return out


def _into_trees(db: sqlite3.Connection) -> None:
    """Schema 2 -> 3, in the caller's transaction: each chat's messages, a list in
    `position` order, become one branch under a root holding the chat's system prompt,
    and the chat shows its last message. Every row joins the branch, whatever its role
    (a stray `system` row stays where it was) or its position: positions are renumbered
    1..n in their old order (ties by id) under the root's 0, as one of -2**63 leaves no
    room below it. A chat that is a tree already (a parent set) is left as it is."""
    chats = [r[0] for r in db.execute("SELECT id FROM chats")]
    for chat_id in chats:
        if db.execute(
            "SELECT 1 FROM messages WHERE chat_id = ? AND parent_id IS NOT NULL LIMIT 1",
            (chat_id,),
        ).fetchone():
            continue
        rows = [
            r[0]
            for r in db.execute(
                "SELECT id FROM messages WHERE chat_id = ? ORDER BY position, id", (chat_id,)
            )
        ]
        # Through n + 0.5 first: no new position may meet an old one still there (UNIQUE).
        for step in (0.5, 0):
            for n, row in enumerate(rows, 1):
                db.execute("UPDATE messages SET position = ? WHERE id = ?", (n + step, row))
        # The system prompt copied by SQLite as it is stored (checked when read).
        parent = db.execute(
            "INSERT INTO messages (chat_id, position, role, content, status, created)"
            " SELECT id, 0, 'system', COALESCE(system, ''), 'complete', created"
            " FROM chats WHERE id = ?",
            (chat_id,),
        ).lastrowid
        for row in rows:
            db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (parent, row))
            parent = row
        db.execute("UPDATE chats SET leaf_id = ? WHERE id = ?", (parent, chat_id))
