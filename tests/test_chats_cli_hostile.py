"""`phasechat chats` on broken, foreign and unreachable data: one line, never a
traceback, and nothing written to a database it cannot own. Run as a user runs it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from phasechat.chat.store.database import ChatStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "phasechat" / "chats.db"


def phasechat(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args], capture_output=True, input=stdin, timeout=300
    )


def one_line_error(r: subprocess.CompletedProcess[bytes]) -> str:
    err = r.stderr.decode()
    assert r.returncode != 0
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("phasechat: ")
    return err


def saved(db: Path, title: str = "kept chat") -> int:
    with ChatStore() as store:
        assert store.path == db
        chat_id = store.create_chat(title=title)
    return chat_id


def test_garbage_database_is_one_line(db: Path) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database\n" * 100)
    for args in (("chats",), ("chats", "delete", "1"), ("chats", "search", "x")):
        err = one_line_error(phasechat(*args))
        assert str(db) in err
    assert db.read_bytes() == b"this is not a database\n" * 100


def test_truncated_database_is_one_line(db: Path) -> None:
    with ChatStore() as store:
        for i in range(300):
            store.create_chat(title=f"chat number {i} " + "x" * 100)
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    for args in (("chats",), ("chats", "export", "1")):
        r = phasechat(*args)
        if r.returncode != 0:  # SQLite may read the pages that survived: then no error
            one_line_error(r)


def test_data_path_that_is_a_file_is_one_line(db: Path) -> None:
    db.parent.parent.mkdir(parents=True)
    db.parent.write_text("a file where the data folder should be")
    one_line_error(phasechat("chats", "delete", "1"))
    one_line_error(phasechat("chats", "rename", "1", "x"))
    r = phasechat("chats")  # reading: nothing saved there, said plainly
    assert r.returncode == 0 and b"no saved chats" in r.stdout


@pytest.fixture
def readonly_data(db: Path, tmp_path: Path) -> Iterator[Path]:
    """The data directory made read-only for real: a read-only tmpfs when we are root
    (root ignores file modes), else mode 0500."""
    folder = db.parent
    folder.mkdir(parents=True)
    if os.geteuid() != 0:
        saved(db)
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)]).returncode:
        pytest.skip("cannot mount a tmpfs to make a read-only folder")
    try:
        folder.chmod(0o700)
        saved(db)
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_read_only_data_dir_lists_and_exports_and_refuses_writes_in_one_line(
    readonly_data: Path,
) -> None:
    r = phasechat("chats")
    assert r.returncode == 0, r.stderr
    assert b"kept chat" in r.stdout
    assert phasechat("chats", "export", "1").returncode == 0
    one_line_error(phasechat("chats", "delete", "1"))


def test_newer_database_is_read_but_never_written(db: Path) -> None:
    chat_id = saved(db, "from the future")
    with closing(sqlite3.connect(db)) as con:
        con.execute("PRAGMA user_version = 42")
    r = phasechat("chats")
    assert r.returncode == 0 and b"from the future" in r.stdout
    assert phasechat("chats", "export", str(chat_id)).returncode == 0
    err = one_line_error(phasechat("chats", "rename", str(chat_id), "new"))
    assert "newer phasechat" in err
    with closing(sqlite3.connect(db)) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 42
        assert con.execute("SELECT title FROM chats").fetchone()[0] == "from the future"


def test_ask_with_a_prompt_that_is_not_utf8_is_one_line_and_saves_nothing(db: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "phasechat", "ask", os.fsdecode(b"caf\xe9 au lait")],
        capture_output=True,
        timeout=300,
    )
    err = one_line_error(r)
    assert "not valid UTF-8" in err
    r = phasechat("ask", "-", stdin=b"caf\xe9\n")
    assert "not valid UTF-8" in one_line_error(r)
    assert not db.exists() or b"(untitled)" not in phasechat("chats").stdout


def test_rename_to_a_title_that_is_not_utf8_is_one_line(db: Path) -> None:
    chat_id = saved(db, "old title")
    r = subprocess.run(
        [sys.executable, "-m", "phasechat", "chats", "rename", str(chat_id), os.fsdecode(b"\xff")],
        capture_output=True,
        timeout=300,
    )
    assert "not valid UTF-8" in one_line_error(r)
    assert b"old title" in phasechat("chats").stdout
