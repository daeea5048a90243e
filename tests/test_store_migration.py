"""The schema 2 -> 3 migration (chats become trees) on the files a user may have: one
transaction, all or nothing, and every row of a chat kept in one branch in its old
order, whatever its role or position. The schema-2 files are the fixture phasechat 0.1
wrote (tests/test_store_tree.py), changed through SQLite as another program could."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from phasechat.chat.store.database import ChatStore, StoreError, default_path
from phasechat.chat.store.schema import SCHEMA_VERSION
from phasechat.chat.store.writer import resume
from phasechat.chat.turns import TurnController
from tests.fault_server import fault_server_thread
from tests.helpers import ask
from tests.scripted import ScriptedBackend
from tests.test_cli import phasechat
from tests.test_store_tree import SCHEMA_2

#: Chat 1 of the fixture, as its rows' order gives it, with a stray system row after
#: the first exchange (`with_stray_system`).
CHAT_1 = [
    ("user", "What is prefill?"),
    ("assistant", "Prefill reads the prompt. "),
    ("system", "Answer in one line."),
    ("user", "And decode?"),
    ("assistant", "Prefill reads the prompt. "),
]


def schema_2(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCHEMA_2, path)
    return path


def with_stray_system(path: Path) -> Path:
    """The schema-2 fixture at `path`, chat 1 with a `system` row between its exchanges."""
    with closing(sqlite3.connect(schema_2(path))) as db, db:
        db.execute(
            "UPDATE messages SET position = position + 10 WHERE chat_id = 1 AND position >= 2"
        )
        db.execute(
            "INSERT INTO messages (chat_id, position, role, content, status, created)"
            " VALUES (1, 5, 'system', 'Answer in one line.', 'complete', 1796247587.9)"
        )
    return path


def version(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def shown(store: ChatStore, chat_id: int) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.load(chat_id).messages]


def test_a_stray_system_row_keeps_its_place_and_ask_chat_sends_the_history() -> None:
    path = with_stray_system(default_path())
    before = phasechat("chats", "export", "1")  # read-only: not migrated yet
    assert before.returncode == 0, before.stderr
    assert version(path) == 2
    with fault_server_thread() as srv:
        r = phasechat(
            "ask", "--backend", "openai", "--base-url", srv.base_url, "--model", "ok-2",
            "--chat", "1", "And then?",
        )  # fmt: skip
        (sent,) = [q["messages"] for q in srv.requests if "messages" in q]
    assert r.returncode == 0, r.stderr
    assert version(path) == SCHEMA_VERSION
    # the whole chat, in its order, after its system prompt (the one the chat had)
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "Be brief."),
        *CHAT_1,
        ("user", "And then?"),
    ]
    after = phasechat("chats", "export", "1")
    assert after.returncode == 0, after.stderr
    for text in (before.stdout, after.stdout):
        headings = [line.split(" (")[0] for line in text.splitlines() if line.startswith("## ")]
        assert headings[:5] == ["## User", "## Assistant", "## System", "## User", "## Assistant"]
        assert "Answer in one line." in text and "And decode?" in text
    with ChatStore(path) as store:
        assert shown(store, 1) == [*CHAT_1, ("user", "And then?"), ("assistant", "tok tok ")]
        conversation = store.load(1)
        assert len(conversation.children(None)) == 1  # one root: no loose messages
        assert shown(store, 2) == [("user", "Hello"), ("assistant", "Hi. ")]


@pytest.mark.parametrize("position", [-(2**63), 2**63 - 1])
async def test_a_position_at_the_edge_of_sqlite_keeps_its_order_and_the_chat_goes_on(
    tmp_path: Path, position: int
) -> None:
    path = schema_2(tmp_path / "chats.db")
    with closing(sqlite3.connect(path)) as db, db:  # the first question first, the last last
        row = 1 if position < 0 else 4
        db.execute("UPDATE messages SET position = ? WHERE id = ?", (position, row))
    with ChatStore(path) as store:
        assert shown(store, 1) == [CHAT_1[i] for i in (0, 1, 3, 4)]
        assert len(store.load(1).children(None)) == 1
        turns = TurnController(ScriptedBackend(text="more"))
        resume(turns, store, 1)
        await ask(turns, "And then?")  # a position after the last one can be given
        assert store.error is None
    with ChatStore(path) as store:
        assert [c for _, c in shown(store, 1)][-2:] == ["And then?", "more "]
    assert version(path) == SCHEMA_VERSION


def test_a_migration_failing_halfway_leaves_the_old_file_as_it_was(tmp_path: Path) -> None:
    path = schema_2(tmp_path / "chats.db")
    with closing(sqlite3.connect(path)) as db, db:
        # The failure, injected: chat 2's rows cannot be changed, so the data step
        # fails after the columns were added and chat 1 converted.
        db.execute(
            "CREATE TRIGGER injected BEFORE UPDATE ON messages WHEN old.chat_id = 2"
            " BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )
        dump = list(db.iterdump())
    with pytest.raises(StoreError, match="injected failure") as info:
        ChatStore(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert version(path) == 2
    with closing(sqlite3.connect(path)) as db:
        assert list(db.iterdump()) == dump  # no column added, no row changed
    with ChatStore(path, readonly=True) as store:  # still readable, every message
        assert shown(store, 1) == [CHAT_1[i] for i in (0, 1, 3, 4)]
        assert shown(store, 2) == [("user", "Hello"), ("assistant", "Hi. ")]
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TRIGGER injected")
    with ChatStore(path) as store:  # the failure gone, it migrates whole
        assert shown(store, 1) == [CHAT_1[i] for i in (0, 1, 3, 4)]
    assert version(path) == SCHEMA_VERSION
