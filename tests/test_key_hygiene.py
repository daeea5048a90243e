"""An API key pasted badly, or echoed by a careless server: never printed, stored or sent
broken. Against the scripted fault server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.http_errors import connect_message
from phasechat.chat.config.settings import Settings
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.writer import follow
from phasechat.chat.turns import Exchange, TurnController
from tests.fault_server import FaultServer

ENV = "PHASECHAT_HOSTILE_KEY"
KEY = "sk-" + "k3y" * 20


def folder_bytes(folder: Path) -> bytes:
    """Every byte of the files in `folder` (the database and its WAL)."""
    return b"".join(p.read_bytes() for p in folder.iterdir())


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as s:
        yield s


async def ask(server: FaultServer, model: str, store: ChatStore | None = None) -> Exchange:
    backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model=model, api_key_env=ENV))
    turns = TurnController(backend, Settings(max_tokens=8))
    if store is not None:
        follow(turns, store, store.create_chat())
    try:
        await backend.start()
        async for _ in turns.send("hello"):
            pass
    finally:
        await backend.aclose()
    return turns.exchanges[-1]


@pytest.mark.parametrize("pasted", [KEY + "\n", KEY + "\r\n", "  " + KEY + "\t"])
async def test_whitespace_around_the_key_is_removed_with_a_notice(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, pasted: str
) -> None:
    monkeypatch.setenv(ENV, pasted)
    ex = await ask(server, "ok-2")
    assert ex.answer.status == "complete"
    assert server.headers[-1]["authorization"] == f"Bearer {KEY}"
    assert any(f"removed whitespace around the API key in ${ENV}" in n for n in ex.trace.notices)


@pytest.mark.parametrize(("bad", "what"), [("sk-abc\ndef" + "x" * 20, "control"),
                                           ("sk-abc\rdef" + "x" * 20, "control"),
                                           ("sk-abcключ" + "x" * 20, "non-ASCII")])  # fmt: skip
async def test_a_key_with_a_control_or_non_ascii_character_is_refused_in_one_line(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bad: str, what: str
) -> None:
    monkeypatch.setenv(ENV, bad)
    with ChatStore(tmp_path / "chats.db") as store:
        ex = await ask(server, "ok-2", store)
    error = ex.answer.error or ""
    assert f"has a {what} character at position 7" in error and "\n" not in error
    assert "def" not in error and "ключ" not in error and "abc" not in error
    assert server.requests == []  # nothing was sent, the key included
    raw = folder_bytes(tmp_path)
    assert b"sk-abc" not in raw and "ключ".encode() not in raw


async def test_a_long_key_echoed_and_cut_short_by_the_server_is_redacted(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-" + "".join(f"{i:03d}" for i in range(100))  # 303 characters, no repeats
    monkeypatch.setenv(ENV, key)
    for model in ("echokey", "echokey-stream"):
        ex = await ask(server, model)
        error = ex.answer.error or ""
        assert "invalid credentials Bearer sk-…redacted" in error
        assert key[3:12] not in error and key[100:120] not in error


def test_a_refused_header_value_is_never_quoted() -> None:
    exc = httpx.LocalProtocolError(f"Illegal header value b'Bearer {KEY}\\n'")
    message = connect_message(exc, "http://127.0.0.1:1/v1")
    assert KEY[3:12] not in message and "header" in message
