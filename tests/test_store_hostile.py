"""The chat database against broken disks, other windows, newer versions and deletes:
nothing lost, nothing left behind. Real SQLite files throughout; a full disk is a real
SQLITE_FULL, from `PRAGMA max_page_count` capping the file at its current size."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta
from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.store.database import ChatStore, StoreError, failure
from phasechat.chat.store.writer import follow, resume
from phasechat.chat.turns import FLUSH_S, SaveFailed, SaveRecovered, TurnController, TurnEvent
from phasechat.chat.workspace import Workspace
from tests.scripted import ScriptedBackend

SECRET = "zanzibarquokka"  # a word that appears nowhere else in the file


def saving(event: TurnEvent) -> list[tuple[str, bool]]:
    """What `event` says of saving: (its line, whether saving works again), or nothing."""
    match event:
        case SaveFailed(line):
            return [(line, False)]
        case SaveRecovered(line):
            return [(line, True)]
    return []


def chat(turns: TurnController, prompt: str) -> None:
    async def go() -> None:
        async for _ in turns.send(prompt):
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
        turns = TurnController(ScriptedBackend(text=f"{SECRET} answer"))
        chat_id = store.create_chat()
        follow(turns, store, chat_id)
        chat(turns, f"tell me about {SECRET}")
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
    ws = Workspace(Config(), BackendSpec(), backend=ScriptedBackend(text="first answer"))
    ws.turns.subscribe(lambda event: heard.extend(saving(event)))
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


class FillsTheDisk(ScriptedBackend):
    """Answers "first answer", then streams an answer slowly enough to be saved as it
    goes (FLUSH_S), and fills the disk half way through it."""

    store: ChatStore | None = None

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if self.store is None:
            async for event in super().stream(request):
                yield event
            return
        for k in range(6):
            if k == 3:
                fill_disk(self.store)
            yield TextDelta(f"part{k} " + "words " * 500)
            await asyncio.sleep(FLUSH_S + 0.1)
        yield Finished("stop")


def test_a_write_on_a_full_disk_says_write_names_the_file_and_keeps_what_was_saved(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chats.db"
    store = ChatStore(path)
    heard: list[str] = []
    backend = FillsTheDisk(text="first answer")
    ws = Workspace(Config(), BackendSpec(), backend=backend)
    ws.turns.subscribe(lambda event: heard.extend(line for line, _ in saving(event)))
    ws.store = store
    assert ws.ensure_chat() is None
    chat(ws.turns, "one")
    backend.store = store
    chat(ws.turns, "two")
    # said once, as a write that failed, naming the file (it said "cannot read" before)
    assert len(heard) == 1, heard
    assert heard[0].startswith(f"chat not saved: cannot write {path}: database or disk is full")
    assert "read" not in heard[0]
    # nothing already saved is lost: the first exchange whole, the answer as far as it
    # was saved before the disk filled; the whole answer in memory
    answer = ws.turns.conversation.messages[-1]
    assert answer.content.startswith("part0") and "part5" in answer.content
    chat_id = ws.chat_id()
    assert chat_id is not None
    with ChatStore(path, readonly=True) as reader:
        saved = [m.content for m in reader.load(chat_id).messages]
    assert saved[:3] == ["one", "first answer ", "two"]
    assert saved[3].startswith("part0") and "part5" not in saved[3]
    free_disk(store)
    assert ws.retry_save()
    assert [m.content for m in store.load(chat_id).messages][-1] == answer.content
    store.close()


OPEN_WITH_A_FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, not the process
from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta
from phasechat.chat.store.database import ChatStore, StoreError, failure
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    ChatStore(sys.argv[1])
except StoreError as exc:
    print(exc)
"""


@pytest.mark.parametrize("existing", [True, False])
def test_opening_on_a_full_disk_says_it_cannot_write_and_the_file_is_untouched(
    tmp_path: Path, existing: bool
) -> None:
    """Opening writes (the WAL's index, the schema): under a file-size limit (the kernel's
    RLIMIT_FSIZE, as a full quota does) those writes fail; it said "cannot read"."""
    path = tmp_path / "chats.db"
    if existing:
        with ChatStore(path) as store:
            follow(TurnController(ScriptedBackend(text="kept")), store, store.create_chat())
        before = path.read_bytes()
    limit = 1_000  # bytes: less than a page
    run = subprocess.run(
        [sys.executable, "-c", OPEN_WITH_A_FULL_DISK, str(path), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip()
    assert line.startswith(f"cannot write {path}: "), line
    assert "read" not in line and "\n" not in line
    if existing:
        assert path.read_bytes() == before
        with ChatStore(path) as store:
            assert store.list_chats()


def test_a_failure_is_named_for_what_failed(tmp_path: Path) -> None:
    """Real SQLite errors, mapped: a write's as a write, a damaged file's as a read."""
    path = tmp_path / "chats.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
        db.execute("PRAGMA max_page_count = 2")
        with pytest.raises(sqlite3.OperationalError) as full:
            db.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,))
    assert failure(path, full.value, writing=False) == (
        f"cannot write {path}: database or disk is full"
    )
    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert failure(path, enospc, writing=False) == (
        f"cannot write {path}: {os.strerror(errno.ENOSPC)}"
    )
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"not a database" * 1000)
    with closing(sqlite3.connect(damaged)) as db, pytest.raises(sqlite3.DatabaseError) as bad:
        db.execute("SELECT * FROM sqlite_master")
    assert failure(damaged, bad.value, writing=False) == (
        f"{damaged}: cannot read the chat database (file is not a database)"
    )
    with pytest.raises(StoreError, match="cannot read the chat database"):
        ChatStore(damaged)


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
