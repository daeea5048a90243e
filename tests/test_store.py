"""The chat database: round trips through a real session, crash safety, search, titles."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import (
    INTERRUPTED,
    TITLE_CHARS,
    ChatNotFound,
    ChatStore,
    default_path,
)
from phasechat.chat.store.writer import follow, resume
from phasechat.chat.turns import ConversationWatcher, TurnController
from phasechat.telemetry.metrics import metrics_from_dict
from tests.scripted import ScriptedBackend


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory of this test's own (subprocesses inherit it)."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home


@pytest.fixture
def store(data_home: Path) -> Iterator[ChatStore]:
    with ChatStore() as s:
        yield s


def offline_session(*messages: ChatMessage, system: str = "") -> TurnController:
    """A session over an unloaded backend, holding `messages` (nothing is generated)."""
    turns = TurnController(LocalBackend())
    turns.replace_conversation(Conversation(system, messages))
    return turns


def test_database_lives_in_xdg_data_home_and_uses_wal(data_home: Path, store: ChatStore) -> None:
    assert store.path == default_path() == data_home / "phasechat" / "chats.db"
    assert store.journal_mode() == "wal"
    store.create_chat()
    assert store.path.with_name("chats.db-wal").exists()


def test_messages_round_trip_with_status_and_metrics(store: ChatStore) -> None:
    metrics = metrics_from_dict({"ttft_ms": 12.5, "output_tokens": 3, "warnings": []})
    turns = offline_session(
        ChatMessage("user", "Why is the sky blue?"),
        ChatMessage("assistant", "Rayleigh", "local", "m.gguf", metrics=metrics),
        ChatMessage("user", "More?"),
        ChatMessage("assistant", "", "lab", "qwen", status="error", error="HTTP 500"),
        ChatMessage("user", "Again"),
        ChatMessage("assistant", "Scatt", "lab", "qwen", status="cancelled"),
        system="Be brief.",
    )
    chat_id = store.create_chat(system="Be brief.")
    follow(turns, store, chat_id)
    loaded = store.load(chat_id)
    assert loaded.system == "Be brief."
    got = [(m.role, m.content, m.backend, m.model, m.status, m.error) for m in loaded.messages]
    want = [
        (m.role, m.content, m.backend, m.model, m.status, m.error)
        for m in turns.conversation.messages
    ]
    assert got == want
    assert loaded.messages[1].metrics == metrics
    summary = store.get(chat_id)
    assert (summary.title, summary.messages, summary.backend, summary.model) == (
        "Why is the sky blue?", 6, "lab", "qwen",
    )  # fmt: skip


def test_streaming_answer_reloads_as_interrupted_with_its_text(store: ChatStore) -> None:
    turns = offline_session(
        ChatMessage("user", "Tell me a story"),
        ChatMessage("assistant", "Once upon a", "local", "m.gguf", status="streaming"),
    )
    chat_id = store.create_chat()
    follow(turns, store, chat_id)
    answer = store.load(chat_id).messages[1]
    assert (answer.content, answer.status, answer.error) == (
        "Once upon a",
        "cancelled",
        INTERRUPTED,
    )
    assert answer.in_prompt  # the partial text goes back to the model, as after Esc


def test_title_is_the_first_user_message_on_one_line(store: ChatStore) -> None:
    long = "  Explain\n\n the   difference between prefill and decode " + "in detail " * 10
    chat_id = store.create_chat()
    follow(
        offline_session(ChatMessage("user", long), ChatMessage("user", "second")), store, chat_id
    )
    title = store.get(chat_id).title
    assert title.startswith("Explain the difference between prefill and decode in")
    assert len(title) <= TITLE_CHARS and title.endswith("…") and "\n" not in title
    named = store.create_chat(title="Kept")
    follow(offline_session(ChatMessage("user", "not the title")), store, named)
    assert store.get(named).title == "Kept"


def test_rename_delete_and_missing_ids(store: ChatStore) -> None:
    a = store.create_chat(title="a")
    b = store.create_chat(title="b")
    follow(offline_session(ChatMessage("user", "zebra crossing")), store, b)
    store.rename(a, "  renamed\nchat ")
    assert store.get(a).title == "renamed chat"
    assert [c.id for c in store.list_chats()] == [a, b]  # renaming touches `updated`
    store.delete(b)
    assert [c.id for c in store.list_chats()] == [a]
    assert store.search("zebra") == []  # its messages (and their index rows) went too
    for call in (store.get, store.load, store.delete, lambda i: store.rename(i, "x")):
        with pytest.raises(ChatNotFound, match="no chat with id 99"):
            call(99)
    with pytest.raises(ValueError, match="empty"):
        store.rename(a, "   ")


def test_search_matches_words_and_prefixes_and_accepts_any_text(store: ChatStore) -> None:
    one = store.create_chat()
    follow(offline_session(ChatMessage("user", "KV cache eviction policy")), store, one)
    two = store.create_chat()
    follow(offline_session(ChatMessage("assistant", "Prefill is compute bound.")), store, two)
    assert [h.chat_id for h in store.search("evict cache")] == [one]  # prefix, any order
    assert [h.chat_id for h in store.search("prefill")] == [two]  # case-insensitive
    hit = store.search("COMPUTE")[0]
    assert hit.role == "assistant" and "compute" in hit.snippet
    exported = store.open_chat(two)
    assert [exported.rows[m.id] for m in exported.conversation.messages] == [hit.message_id]
    assert store.search("cache prefill") == []  # every word must match one message
    for odd in ('"', "AND OR NOT (", "*", "a:b", "  "):
        assert isinstance(store.search(odd), list)  # no FTS syntax error reaches the user


@pytest.mark.model
async def test_live_session_is_written_per_flush_and_can_be_resumed(
    store: ChatStore, local_backend: LocalBackend
) -> None:
    turns = TurnController(local_backend, Settings(max_tokens=120, temperature=0.0, seed=1))
    chat_id = store.create_chat(system=turns.settings.system)
    follow(turns, store, chat_id)
    seen: list[tuple[str, str, str]] = []

    class Reader(ConversationWatcher):
        """After the store, read the row back through a separate connection."""

        def message_updated(self, message: ChatMessage, final: bool) -> None:
            if not final:
                with closing(sqlite3.connect(store.path)) as db:
                    row = db.execute(
                        "SELECT content, status FROM messages WHERE role = 'assistant'"
                    ).fetchone()
                seen.append((message.content, row[0], row[1]))

    turns.subscribe(Reader())
    async for _ in turns.send("Write a long story about a lighthouse keeper."):
        pass
    assert seen, "the answer streamed for less than one flush interval"
    for live, stored, status in seen:
        assert stored == live and status == "streaming"  # committed, visible to others
    answer = turns.conversation.messages[-1]
    loaded = store.load(chat_id).messages[-1]
    assert (loaded.content, loaded.status, loaded.model) == (
        answer.content, "complete", local_backend.model,
    )  # fmt: skip
    assert answer.metrics is not None and loaded.metrics == answer.metrics

    follower = TurnController(local_backend, Settings(max_tokens=4, temperature=0.0))
    resume(follower, store, chat_id)
    assert follower.settings.system == turns.settings.system
    assert len(follower.request().messages) == 3  # system + the stored exchange
    async for _ in follower.send("Thanks!"):
        pass
    history = store.load(chat_id).messages
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[2].content == "Thanks!" and history[0].content.startswith("Write a long")


STORY = "Write a very long story about a lighthouse keeper, a storm and a lost ship."


@pytest.mark.model
def test_sigkill_mid_answer_keeps_the_prompt_and_the_partial_answer(data_home: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "phasechat", "ask", "--max-tokens", "400", "--n-ctx", "1024",
         "--seed", "3", STORY],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    db = default_path()
    partial = ""
    deadline = time.monotonic() + 300  # a guard against a hang, not a timing assertion
    try:
        while not partial:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no streamed text reached the database"
            time.sleep(0.05)
            try:
                with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as ro:
                    row = ro.execute(
                        "SELECT content FROM messages WHERE role = 'assistant'"
                        " AND status = 'streaming'"
                    ).fetchone()
            except sqlite3.OperationalError:  # not created yet
                continue
            partial = row[0] if row else ""
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    with ChatStore() as store:
        (chat,) = store.list_chats()
        assert chat.title == STORY[:59].rstrip() + "…" and chat.messages == 2
        user, answer = store.load(chat.id).messages
    assert (user.role, user.content) == ("user", STORY)
    assert answer.content.startswith(partial) and answer.content
    assert (answer.status, answer.error) == ("cancelled", INTERRUPTED)
    assert answer.metrics is None  # it never finished, so no metrics were recorded


def test_an_untitled_chat_is_untitled_not_unreadable(store: ChatStore) -> None:
    """Issue 49: a chat with no title yet (NULL, as a new chat has) lists and searches as
    "(untitled)"; "(unreadable title)" is for a title cell that holds something else."""
    chat_id = store.create_chat()
    store.add_message(chat_id, ChatMessage("assistant", "a lighthouse keeper"), None)
    assert [s.title for s in store.list_chats() if s.id == chat_id] == ["(untitled)"]
    assert store.get(chat_id).title == "(untitled)" and store.get(chat_id).unreadable == ()
    [hit] = store.search("lighthouse")
    assert (hit.chat_id, hit.title) == (chat_id, "(untitled)")


class CountingStore(ChatStore):
    """A store that notes each write of a message row: (what, its role, final, status,
    whether its anatomy was in it)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, str, bool, str, bool]] = []

    def add_message(self, chat_id: int, m: ChatMessage, parent_row: int | None) -> int:
        self.writes.append(("add", m.role, False, m.status, m.anatomy is not None))
        return super().add_message(chat_id, m, parent_row)

    def update_message(self, chat_id: int, row: int, m: ChatMessage, final: bool) -> None:
        self.writes.append(("update", m.role, final, m.status, m.anatomy is not None))
        super().update_message(chat_id, row, m, final)


async def test_one_turn_writes_its_answer_row_once_at_the_end_with_its_anatomy(
    data_home: Path,
) -> None:
    store = CountingStore()
    with store:
        turns = TurnController(ScriptedBackend(text="a short answer"))
        follow(turns, store, store.create_chat())
        await turns.send("a question")
        answer = [w for w in store.writes if w[1] == "assistant"]
        # inserted as it starts streaming, then written once, final, anatomy and all
        assert answer == [
            ("add", "assistant", False, "streaming", False),
            ("update", "assistant", True, "complete", True),
        ]
        assert [w for w in store.writes if w[1] == "user"] == [
            ("add", "user", False, "complete", False)
        ]
