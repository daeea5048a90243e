"""The chat database's full-text index (schema 4): an answer is indexed once, when it stops
streaming, not at every flush of its growing text; search still finds it meanwhile; and a
schema-3 file's index (which held streaming rows too) is made again on upgrade.

FTS5's `integrity-check` compares the index with what it indexes (`messages_said`): it
fails on any row indexed with other text than the table holds, or left out."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import pytest

from bench.store_flush import as_schema_3
from phasechat.chat.conversation import ChatMessage, Status
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.opening import _upgrade
from phasechat.chat.store.schema import SCHEMA_VERSION


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.db") as s:
        assert s.fts  # this SQLite has FTS5 (the LIKE fallback is tested in test_store)
        yield s


def indexed(db: sqlite3.Connection, word: str) -> list[int]:
    """The rows the index itself finds for `word` (not `search`, which also reads
    streaming rows directly); the index checked against the table first."""
    db.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
    rows = db.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (word,))
    return sorted(r[0] for r in rows)


def streaming(store: ChatStore, text: str = "") -> tuple[int, int, ChatMessage]:
    """A chat with a question and an answer that starts streaming: (chat, row, answer)."""
    chat = store.create_chat()
    question = ChatMessage("user", "tell me about kestrels")
    above = store.add_message(chat, question, None)
    answer = ChatMessage("assistant", text, status="streaming", parent=question.id)
    return chat, store.add_message(chat, answer, above), answer


def test_a_streaming_answer_is_indexed_once_when_it_ends(store: ChatStore) -> None:
    chat, row, answer = streaming(store, "hovering")
    db = store._db
    assert indexed(db, "kestrels") == [row - 1]  # the question, said at once
    assert indexed(db, "hovering") == []  # not while it streams
    for text in ("hovering kestrels", "hovering kestrels hunt voles"):
        answer.content = text
        store.update_message(chat, row, answer, final=False)
        assert indexed(db, "voles") == [] and indexed(db, "hovering") == []
    answer.content, answer.status = "hovering kestrels hunt voles at dusk", "complete"
    store.update_message(chat, row, answer, final=True)
    assert indexed(db, "dusk") == [row] and indexed(db, "kestrels") == [row - 1, row]
    answer.content = "edited: falcons"  # a said message changed: its old words go
    store.update_message(chat, row, answer, final=True)
    assert indexed(db, "dusk") == [] and indexed(db, "falcons") == [row]


@pytest.mark.parametrize("status", ["cancelled", "error"])
def test_an_answer_that_ends_otherwise_is_indexed_too(store: ChatStore, status: Status) -> None:
    chat, row, answer = streaming(store, "half an answer")
    answer.status = status  # the text as it was: only the status changes
    store.update_message(chat, row, answer, final=True)
    assert indexed(store._db, "half") == [row]


def test_search_finds_an_answer_while_it_streams(store: ChatStore) -> None:
    """Not in the index yet, it is found by every word as a substring, case-insensitive,
    with `%` and `_` as themselves; and never twice once it is indexed."""
    chat, row, answer = streaming(store, "Kestrels HOVER at 100% over fields_of_grass")
    assert [h.message_id for h in store.search("hover kestrel")] == [row]
    assert [h.message_id for h in store.search("100%")] == [row]
    assert [h.message_id for h in store.search("fields_of")] == [row]
    assert store.search("10_%") == [] and store.search("fields%grass") == []
    assert store.search("hover falcon") == []  # every word, as for the index
    answer.status = "complete"
    store.update_message(chat, row, answer, final=True)
    assert [h.message_id for h in store.search("hover")] == [row]


def test_search_lists_streaming_and_indexed_rows_newest_chat_first(store: ChatStore) -> None:
    old_chat, old_row, old = streaming(store, "kestrel one")
    old.status = "complete"
    store.update_message(old_chat, old_row, old, final=True)
    new_chat, new_row, _ = streaming(store, "kestrel two")
    hits = store.search("kestrel")
    # the newer chat first, and in a chat its messages in order (the question first)
    assert [(h.chat_id, h.message_id) for h in hits] == [
        (new_chat, new_row - 1),
        (new_chat, new_row),
        (old_chat, old_row - 1),
        (old_chat, old_row),
    ]
    assert len(store.search("kestrel", limit=3)) == 3


def test_deleting_a_chat_leaves_the_index_whole(store: ChatStore) -> None:
    chat, _, _ = streaming(store, "owls")
    said, said_row, done = streaming(store, "buzzards")
    done.status = "complete"
    store.update_message(said, said_row, done, final=True)
    store.delete(chat)  # its streaming row was never indexed: nothing to take out
    store.delete(said)
    assert indexed(store._db, "owls") == [] and indexed(store._db, "buzzards") == []
    assert store.search("kestrels") == []


def test_a_schema_3_index_is_made_again_without_streaming_rows(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    with ChatStore(path) as store:
        chat, row, answer = streaming(store, "cut off mid hover")
        said, said_row, done = streaming(store, "a whole answer")
        done.status = "complete"
        store.update_message(said, said_row, done, final=True)
        empty = store.create_chat()
    with closing(sqlite3.connect(path)) as db:
        as_schema_3(db)  # as phasechat before schema 4 left it: the streaming row indexed
        db.execute("PRAGMA user_version = 3")
        db.commit()
        assert db.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'hover'")
    with ChatStore(path) as store:  # opened for writing: upgraded
        db = store._db
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        # schema 2's lists became trees at 3: a chat of schema 3 is not made one again
        # (an empty chat would get a root of its own)
        assert tuple(
            db.execute(
                "SELECT COUNT(*), (SELECT leaf_id FROM chats WHERE id = ?) FROM messages"
                " WHERE chat_id = ?",
                (empty, empty),
            ).fetchone()
        ) == (0, None)
        assert indexed(db, "hover") == [] and indexed(db, "whole") == [said_row]
        assert [h.message_id for h in store.search("hover")] == [row]  # found directly
        answer.content = "cut off mid hover, then more"  # the new triggers hold
        store.update_message(chat, row, answer, final=False)
        assert indexed(db, "more") == []
        answer.status = "complete"
        store.update_message(chat, row, answer, final=True)
        assert indexed(db, "more") == [row]


def test_a_schema_3_file_read_only_finds_a_streaming_answer_once(tmp_path: Path) -> None:
    """Read-only (`phasechat chats`, a read-only folder), a schema-3 file is not upgraded:
    its index holds the streaming row, which search also reads directly."""
    path = tmp_path / "chats.db"
    with ChatStore(path) as store:
        _, row, _ = streaming(store, "cut off mid hover")
    with closing(sqlite3.connect(path)) as db:
        as_schema_3(db)
        db.execute("PRAGMA user_version = 3")
        db.commit()
    with ChatStore(path, readonly=True) as store:
        assert [h.message_id for h in store.search("hover")] == [row]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3  # left as it was


def test_a_schema_4_index_is_kept_as_it_is_when_the_store_opens_again(tmp_path: Path) -> None:
    """Only schema 3's index is made again: a rebuild reads every message (seconds on a
    big store), which at every start would be paid again. Seen here by an entry taken
    out of the index by hand: a rebuild would bring it back."""
    path = tmp_path / "chats.db"
    with ChatStore(path) as store:
        chat = store.create_chat()
        row = store.add_message(chat, ChatMessage("user", "ospreys dive"), None)
        kept = store.add_message(chat, ChatMessage("user", "eagles soar"), row)
        store._db.execute(
            "INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', ?, ?)",
            (row, "ospreys dive"),
        )
        store._db.commit()
    with ChatStore(path) as store:
        match = "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
        assert store._db.execute(match, ("osprey*",)).fetchall() == []  # not rebuilt
        assert [r[0] for r in store._db.execute(match, ("eagles",))] == [kept]  # not dropped


class NoFts5:
    """A connection to an SQLite built without FTS5: what names the module fails."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if "fts5" in sql:
            raise sqlite3.OperationalError("no such module: fts5")
        return self.db.execute(sql, *args)


def test_without_fts5_the_schema_is_made_and_search_falls_back_to_like() -> None:
    with closing(sqlite3.connect(":memory:")) as db:
        assert _upgrade(cast(sqlite3.Connection, NoFts5(db)), 0) is False
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        assert {"chats", "messages", "messages_streaming"} <= names
        assert "messages_fts" not in names and "messages_ai" not in names


def test_search_without_the_index_matches_the_whole_text_as_written(store: ChatStore) -> None:
    """The LIKE fallback (an SQLite without FTS5): the whole text as a substring,
    case-insensitive, its `%` and `_` as themselves, newest chat first."""
    store.fts = False
    one = store.create_chat()
    first = store.add_message(one, ChatMessage("user", "Kestrels hover at 100% of fields_x"), None)
    two = store.create_chat()
    second = store.add_message(two, ChatMessage("user", "kestrels HOVER too"), None)
    assert [h.message_id for h in store.search("kestrels hover")] == [second, first]
    assert [h.message_id for h in store.search("100%")] == [first]
    assert store.search("10_%") == [] and store.search("fields%x") == []
    assert [h.message_id for h in store.search("fields_x")] == [first]
    assert store.search("hover kestrels") == []  # the text as written, not its words
    path = store.add_message(two, ChatMessage("user", "saved in C:\\path"), second)
    store.add_message(two, ChatMessage("user", "saved in C:path"), path)
    assert [h.message_id for h in store.search("C:\\path")] == [path]  # a \ is itself
    assert len(store.search("kestrels", limit=1)) == 1


def test_search_gives_fifty_hits_unless_asked_for_more(store: ChatStore) -> None:
    chat = store.create_chat()
    for n in range(51):
        store.add_message(chat, ChatMessage("user", f"harrier {n}"), None)
    assert len(store.search("harrier")) == 50
    assert len(store.search("harrier", limit=60)) == 51


def test_a_word_in_quotes_is_searched_as_the_word(store: ChatStore) -> None:
    """A `"` in a word is doubled inside FTS5's quotes (no query syntax reaches it): the
    index holds words without their quotes, so `"hi"` finds hi."""
    chat = store.create_chat()
    row = store.add_message(chat, ChatMessage("user", 'she said "hi" and left'), None)
    assert [h.message_id for h in store.search('"hi"')] == [row]
    assert [h.message_id for h in store.search('sa"id')] == []  # not `sa` then `id`
