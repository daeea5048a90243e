"""A thinking model's answers in history: the thinking is saved and exported with the
answer, and left out of later prompts (so out of the trimmer's counts)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.export import to_json, to_markdown
from phasechat.chat.store.writer import follow
from phasechat.chat.trim.trimmer import Trimmer
from phasechat.chat.turns import TurnController
from tests.fault_server import FaultServer
from tests.scripted import ScriptedBackend


async def test_thinking_is_saved_and_exported_with_the_answer(tmp_path: Path) -> None:
    async with FaultServer() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="think-6-3-1"))
        turns = TurnController(backend, Settings(max_tokens=64))
        with ChatStore(tmp_path / "chats.db") as store:
            chat_id = store.create_chat()
            follow(turns, store, chat_id)
            async for _ in turns.send("hi"):
                pass
            await backend.aclose()
            loaded = store.load(chat_id)
            summary = store.get(chat_id)
    answer = loaded.messages[-1]
    assert answer.reasoning == "think0 think1 think2 think3 think4 think5 "
    assert answer.content == "ans0 ans1 ans2 "
    assert answer.metrics is not None and answer.metrics.ttfo_ms is not None
    doc = json.loads(to_json(summary, loaded))
    assert doc["messages"][-1]["reasoning"] == answer.reasoning
    assert "reasoning" not in doc["messages"][0]  # the user's turn has none
    md = to_markdown(summary, loaded)
    assert "<details><summary>Thinking</summary>" in md and "> think0 think1" in md
    assert md.index("think5") < md.index("ans0")


def test_a_database_from_before_thinking_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT NOT NULL"
        " DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL,"
        " position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, backend TEXT,"
        " model TEXT, status TEXT NOT NULL, error TEXT, metrics TEXT, created REAL NOT NULL);"
        "INSERT INTO chats VALUES (1, 't', '', 0, 0);"
        "INSERT INTO messages VALUES (1, 1, 0, 'user', 'old question', NULL, NULL,"
        " 'complete', NULL, NULL, 0);"
    )
    db.commit()
    db.close()
    with ChatStore(path) as store:
        (message,) = store.load(1).messages
    assert (message.content, message.reasoning) == ("old question", "")


def test_thinking_is_not_sent_back_nor_counted() -> None:
    conversation = Conversation()
    conversation.add(ChatMessage("user", "q"))
    thought = "long deliberation " * 500
    conversation.add(ChatMessage("assistant", "short answer", reasoning=thought))
    conversation.add(ChatMessage("user", "next"))
    for messages in (conversation.prompt_messages(), Trimmer().prompt_messages(conversation)):
        assert [m.content for m in messages] == ["q", "short answer", "next"]
    # The trimmer's budget check counts the prompt it sends: the thinking adds nothing.
    backend = ScriptedBackend()
    trimmer = Trimmer(budget=60)
    plan = trimmer.prepare(backend, conversation, max_tokens=8)
    assert plan.note is None and not plan.wait  # "over budget" if the thinking counted
    without = Conversation(messages=[ChatMessage(m.role, m.content) for m in conversation.messages])
    sent = backend.count_tokens(trimmer.prompt_messages(conversation)).tokens
    assert sent == backend.count_tokens(without.prompt_messages()).tokens < 60
