"""The chat's writer (chat/store/writer.py) against a real SQLite store whose writes
fail on demand (a locked database, as another process holding it would make): what is
saved, in which order, what is kept for the next try, and what the user is told, once."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.writer import ChatWriter, follow, resume
from phasechat.chat.turns import SaveFailed, SaveRecovered, TurnController, TurnEvent
from tests.scripted import ScriptedBackend

LOCKED = "database is locked"


class Jammed(ChatStore):
    """A real store whose writes raise SQLite's "database is locked" while `jammed`
    (as they do while another process holds the write lock past the busy timeout)."""

    jammed = False

    def _check(self) -> None:
        if self.jammed:
            raise sqlite3.OperationalError(LOCKED)

    def add_message(self, chat_id: int, m: ChatMessage, parent_row: int | None) -> int:
        self._check()
        return super().add_message(chat_id, m, parent_row)

    def update_message(self, chat_id: int, row: int, m: ChatMessage, final: bool) -> None:
        self._check()
        super().update_message(chat_id, row, m, final)

    def show(self, chat_id: int, leaf_row: int, system: str) -> None:
        self._check()
        super().show(chat_id, leaf_row, system)


@pytest.fixture
def store(tmp_path: Path) -> Jammed:
    return Jammed(tmp_path / "chats.db")


def saved(store: ChatStore, chat_id: int) -> list[tuple[str, str, str]]:
    return [(m.role, m.content, m.status) for m in store.load(chat_id).messages]


async def test_writes_that_fail_are_kept_told_once_and_written_in_order_later(
    store: Jammed, caplog: pytest.LogCaptureFixture
) -> None:
    turns = TurnController(ScriptedBackend(text="an answer"), Settings(system="sys"))
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    chat_id = store.create_chat(system="sys")
    writer = follow(turns, store, chat_id)
    await turns.send("q1")
    store.jammed = True
    with caplog.at_level(logging.WARNING, logger="phasechat.chat.store.writer"):
        await turns.send("q2")
    line = (
        f"chat not saved: cannot write {store.path}: {LOCKED}"
        " (retrying; the chat is kept in memory)"
    )
    assert [e for e in heard if isinstance(e, SaveFailed | SaveRecovered)] == [SaveFailed(line)]
    assert store.error == line and caplog.messages == [line] * len(caplog.messages)
    assert len(caplog.messages) >= 2  # every failed try is logged, told once
    q2, a2 = turns.conversation.messages[2:]
    assert writer.pending == [q2, a2] and writer.row_of(q2) is None
    assert saved(store, chat_id) == [
        ("user", "q1", "complete"),
        ("assistant", "an answer ", "complete"),
    ]
    store.jammed = False
    assert writer.flush()
    assert heard[-1] == SaveRecovered("chat saved again: the writes that failed were retried")
    assert store.error is None and writer.pending == [] and writer.row_of(q2) is not None
    # the question, then its answer under it, whole (its final state came while pending)
    assert saved(store, chat_id)[2:] == [
        ("user", "q2", "complete"),
        ("assistant", "an answer ", "complete"),
    ]
    reopened = store.open_chat(chat_id)
    assert reopened.conversation.messages[-1].parent == reopened.conversation.messages[-2].id
    assert writer.flush()  # nothing pending: nothing to tell
    assert [type(e) for e in heard if isinstance(e, SaveFailed | SaveRecovered)] == [
        SaveFailed,
        SaveRecovered,
    ]


async def test_an_update_that_failed_is_written_whole_on_the_next_try(store: Jammed) -> None:
    turns = TurnController(ScriptedBackend(text="an answer"), Settings(system=""))
    chat_id = store.create_chat()
    writer = follow(turns, store, chat_id)
    exchange = turns.begin("q1")
    store.jammed = True
    turns.stop()  # the answer's final state: its write fails
    assert list(writer.stale.values()) == [exchange.answer]
    store.jammed = False
    assert writer.flush()
    assert writer.stale == {}
    loaded = store.load(chat_id).messages[-1]
    assert (loaded.status, loaded.metrics) == ("cancelled", exchange.answer.metrics)


def test_catch_up_saves_what_the_chat_lacks_and_the_branch_it_shows(store: Jammed) -> None:
    c = Conversation("sys", [ChatMessage("user", "q1"), ChatMessage("assistant", "a1")])
    q1 = c.messages[0]
    c.rewind(q1.id)
    a1b = c.add(ChatMessage("assistant", "a1b"))
    c.select(c.messages[0].id)
    chat_id = store.create_chat(system="sys")
    store.jammed = True
    heard: list[SaveFailed | SaveRecovered] = []
    writer = ChatWriter(store, chat_id, report=heard.append)
    assert not writer.catch_up(c)
    assert [m.content for m in writer.pending] == ["sys", "q1", "a1", "a1b"]
    assert writer.shown == (c.leaf, "sys") and len(heard) == 1
    store.jammed = False
    assert writer.flush() and writer.shown is None
    opened = store.open_chat(chat_id)
    assert [m.content for m in opened.conversation.messages] == ["q1", "a1b"]
    assert opened.rows[opened.conversation.messages[-1].id] == writer.row_of(a1b)


def test_an_update_of_a_message_never_added_and_a_branch_never_saved_are_skipped(
    store: Jammed,
) -> None:
    chat_id = store.create_chat()
    writer = ChatWriter(store, chat_id)
    stranger = ChatMessage("user", "never added")
    writer.message_updated(stranger, final=True)
    assert writer.stale == {} and store.error is None
    c = Conversation("", [stranger])
    writer.branch_shown(c)  # its leaf has no row: nothing to show, nothing kept
    assert writer.shown is None
    writer.branch_shown(Conversation(""))  # no leaf at all
    assert writer.shown is None
    assert store.list_chats()[0].id == chat_id


def test_rows_given_are_the_writers_own_copy(store: Jammed) -> None:
    rows = {1: 10}
    writer = ChatWriter(store, store.create_chat(), rows)
    writer.rows[2] = 20
    assert rows == {1: 10} and writer.row_of(ChatMessage("user", "x")) is None


async def test_a_resumed_chat_goes_on_under_its_own_system_prompt_and_rows(
    store: Jammed,
) -> None:
    first = TurnController(ScriptedBackend(text="one"), Settings(system="theirs"))
    chat_id = store.create_chat(system="theirs")
    follow(first, store, chat_id)
    await first.send("q1")
    turns = TurnController(ScriptedBackend(text="two"), Settings(system="mine"))
    writer = resume(turns, store, chat_id)
    assert turns.settings.system == "theirs" and writer.pending == []
    await turns.send("q2")
    assert saved(store, chat_id) == [
        ("user", "q1", "complete"),
        ("assistant", "one ", "complete"),
        ("user", "q2", "complete"),
        ("assistant", "two ", "complete"),
    ]


def test_an_update_while_other_writes_wait_is_kept_for_the_next_try(store: Jammed) -> None:
    chat_id = store.create_chat()
    writer = ChatWriter(store, chat_id)
    first = ChatMessage("user", "first")
    writer.message_added(first)
    store.jammed = True
    second = ChatMessage("assistant", "second", parent=first.id)
    writer.message_added(second)  # pending
    first.content = "first, changed"
    writer.message_updated(first, final=True)  # saved before: rewritten on the next try
    store.jammed = False
    assert writer.flush()
    assert [m.content for m in store.load(chat_id).messages] == ["first, changed", "second"]


async def test_a_chat_changed_is_listed_first_with_its_new_system_prompt(store: Jammed) -> None:
    turns = TurnController(ScriptedBackend(), Settings(system="old"))
    mine = store.create_chat(system="old")
    follow(turns, store, mine)
    other = store.create_chat()  # newer
    assert [c.id for c in store.list_chats()] == [other, mine]
    turns.update_settings(system="new")  # the empty chat's system prompt, rewritten
    assert [c.id for c in store.list_chats()] == [mine, other]
    assert store.get(mine).system == "new"
