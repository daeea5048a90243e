"""The chat database against broken disks, other windows, newer versions and deletes:
nothing lost, nothing left behind. Real SQLite files throughout; a full disk is a real
SQLITE_FULL, from `PRAGMA max_page_count` capping the file at its current size."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.store.database import ChatStore, StoreError
from phasechat.chat.store.writer import follow, resume
from phasechat.chat.turns import TurnController
from phasechat.chat.workspace import Workspace
from tests.scripted import ScriptedBackend

SECRET = "zanzibarquokka"  # a word that appears nowhere else in the file


def chat(session: TurnController, prompt: str) -> None:
    async def go() -> None:
        async for _ in session.send(prompt):
            pass

    asyncio.run(go())


def fill_disk(store: ChatStore) -> None:
    """Cap the database at its current size: the next page it needs is SQLITE_FULL."""
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def free_disk(store: ChatStore) -> None:
    store._db.execute("PRAGMA max_page_count = 1073741823")


def test_deleted_chat_words_are_gone_from_every_file(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    with ChatStore(path) as store:
        session = TurnController(ScriptedBackend(text=f"{SECRET} answer"))
        chat_id = store.create_chat()
        follow(session, store, chat_id)
        chat(session, f"tell me about {SECRET}")
        keep = store.create_chat()
        follow(TurnController(ScriptedBackend()), store, keep)
        assert store.search(SECRET)  # indexed
        store.delete(chat_id)
        assert not store.search(SECRET)
        files = [p for p in tmp_path.iterdir() if p.name.startswith("chats.db")]
        raw = b"".join(p.read_bytes() for p in files)
    assert SECRET.encode() not in raw
    with ChatStore(path) as store:
        assert [c.id for c in store.list_chats()] == [keep]


def test_chat_ids_are_never_reused_after_the_newest_is_deleted(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        first = store.create_chat()
        second = store.create_chat()
        store.delete(second)
        third = store.create_chat()
    assert third not in (first, second)
    assert third == second + 1


def test_full_disk_is_reported_at_once_then_retried_and_nothing_lost(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.db")
    heard: list[tuple[str, bool]] = []
    store.on_error = lambda line, ok: heard.append((line, ok))
    ws = Workspace(Config(), BackendSpec(), backend=ScriptedBackend(text="first answer"))
    ws.store = store
    assert ws.ensure_chat() is None
    chat(ws.turns, "one")
    fill_disk(store)
    ws.turns.backend.text = "x " * 4000  # type: ignore[attr-defined]  # needs new pages
    chat(ws.turns, "two " * 2000)
    assert heard and heard[0][1] is False and "disk is full" in heard[0][0]
    assert store.error is not None
    assert len(heard) == 1  # said once, not once per flush
    free_disk(store)
    assert ws.retry_save()
    assert heard[-1][1] is True and store.error is None
    chat_id = ws.chat_id()
    assert chat_id is not None
    saved = store.load(chat_id)
    assert [m.content for m in saved.messages] == [
        m.content for m in ws.turns.conversation.messages
    ]
    assert saved.messages[-1].status == "complete"
    store.close()


def test_full_disk_before_the_first_send_keeps_the_chat_and_saves_it_later(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.db")
    fill_disk(store)
    ws = Workspace(Config(), BackendSpec(), backend=ScriptedBackend(text="kept"))
    ws.store = store
    ws.turns.update_settings(system="a long system prompt " * 500)  # needs new pages
    error = ws.ensure_chat()
    assert error is not None and "chat not saved" in error and "full" in error
    chat(ws.turns, "my long prompt")  # the app goes on; the prompt is in memory
    free_disk(store)
    assert ws.ensure_chat() is None  # the next send creates it with what was said
    chat_id = ws.chat_id()
    assert chat_id is not None
    assert [m.content for m in store.load(chat_id).messages][:2] == ["my long prompt", "kept "]
    store.close()


def test_two_windows_on_one_chat_both_save(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    with ChatStore(path) as a, ChatStore(path) as b:
        chat_id = a.create_chat()
        one, two = (
            TurnController(ScriptedBackend(text="A")),
            TurnController(ScriptedBackend(text="B")),
        )
        resume(one, a, chat_id)
        resume(two, b, chat_id)
        chat(one, "from window one")
        chat(two, "from window two")
        assert a.error is None and b.error is None
        saved = a.load(chat_id)
    # Both saved, as two branches from the same point; the chat shows the newer one.
    assert [m.content for m in saved.messages] == ["from window two", "B "]
    questions = saved.siblings(saved.messages[0])
    assert [m.content for m in questions] == ["from window one", "from window two"]
    assert [m.content for m in saved.children(questions[0].id)] == ["A "]


def test_database_from_a_newer_phasechat_is_refused_and_not_downgraded(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    with ChatStore(path) as store:
        store.create_chat(title="future")
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer phasechat") as info:
        ChatStore(path)
    assert "\n" not in str(info.value)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 99
    with ChatStore(path, readonly=True) as store:  # still readable
        assert [c.title for c in store.list_chats()] == ["future"]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 99


@pytest.mark.parametrize(
    "content", [b"not a database at all" * 10, b"SQLite format 3\x00" + b"\xff" * 50]
)
def test_corrupt_database_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "chats.db"
    path.write_bytes(content)
    for readonly in (False, True):
        with pytest.raises(StoreError) as info:
            ChatStore(path, readonly=readonly)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_rename_to_text_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        chat_id = store.create_chat(title="old")
        with pytest.raises(ValueError, match="not valid UTF-8"):
            store.rename(chat_id, "bad \udcff title")
        assert store.get(chat_id).title == "old"
