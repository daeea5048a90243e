"""Branches on disk: the tree saved and read back, the branch shown remembered, a
database written by the previous schema (a file phasechat 0.1 wrote, before branches)
migrated in place, and chats created by many processes at once."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path

from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.export import to_json
from phasechat.chat.store.schema import SCHEMA_VERSION
from phasechat.chat.store.writer import follow, resume
from phasechat.chat.turns import TurnController
from tests.helpers import answer, ask
from tests.scripted import ScriptedBackend

#: Written by phasechat at schema 2 (the commit before branches): chat 1 is "Be brief."
#: with two exchanges, chat 2 has no system prompt and one exchange.
SCHEMA_2 = Path(__file__).parent / "fixtures" / "store" / "chats-schema-2.db"


def contents(messages: Iterable[ChatMessage]) -> list[str]:
    return [m.content for m in messages]


async def test_every_branch_is_saved_and_the_chat_reopens_on_the_branch_shown(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chats.db"
    turns = TurnController(ScriptedBackend(text="A"), Settings(system="sys"))
    with ChatStore(path) as store:
        chat_id = store.create_chat()
        follow(turns, store, chat_id)
        for q in ("q1", "q2", "q3"):
            await ask(turns, q)
        q2 = turns.conversation.messages[2]
        await answer(turns, turns.edit(q2.id, "q2 edited"))
        await answer(turns, turns.retry())  # a second answer to the edited question
        turns.update_settings(system="other sys")
        await answer(turns, turns.retry())  # and the same under another system prompt
        assert store.error is None
    with ChatStore(path) as store:
        saved = store.load(chat_id)
        assert contents(saved.messages) == contents(turns.conversation.messages)
        assert saved.system == "other sys"
        assert len(list(saved.every())) == len(list(turns.conversation.every()))
        roots = saved.children(None)
        assert contents(roots) == ["sys", "other sys"]
        first = saved.path(saved.children(saved.children(roots[0].id)[0].id)[0].id)
        assert contents(first) == ["sys", "q1", "A "]
        q2s = saved.siblings(saved.path()[3])  # the branch shown: the edited question
        assert contents(q2s) == ["q2 edited"]  # copied under the new root: one here
        assert store.list_chats()[0].system == "other sys"  # the branch shown's
        assert store.list_chats()[0].messages == len(list(saved.every())) - 2  # no roots

    # Show the first root's branch, then reopen: the chat shows it again.
    with ChatStore(path) as store:
        again = TurnController(ScriptedBackend(text="B"))
        resume(again, store, chat_id)
        root = again.conversation.root
        again.show_sibling(root.id, -1)
        shown = contents(again.conversation.messages)
        assert again.settings.system == "sys"
    with ChatStore(path) as store:
        reopened = store.load(chat_id)
        assert contents(reopened.messages) == shown and reopened.system == "sys"
        assert store.get(chat_id).system == "sys"


async def test_search_and_delete_reach_every_branch(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        turns = TurnController(ScriptedBackend(text="ok"))
        chat_id = store.create_chat()
        follow(turns, store, chat_id)
        await ask(turns, "about zeppelins")
        await answer(turns, turns.edit(turns.conversation.messages[0].id, "about balloons"))
        assert [h.chat_id for h in store.search("zeppelins")] == [chat_id]  # an old branch
        store.delete(chat_id)
        assert store.search("zeppelins") == [] and store.search("balloons") == []


async def test_json_export_holds_the_tree_with_the_ids_ask_prints(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        turns = TurnController(ScriptedBackend(text="ok"), Settings(system=""))
        chat_id = store.create_chat()
        writer = follow(turns, store, chat_id)
        await ask(turns, "q")
        await answer(turns, turns.retry())
        saved = store.open_chat(chat_id)
        doc = json.loads(to_json(store.get(chat_id), saved.conversation, saved.rows))
    by_id = {m["id"]: m for m in doc["messages"]}
    question = turns.conversation.messages[0]
    first, second = turns.conversation.children(question.id)
    assert [writer.rows[m.id] for m in (first, second)] == [
        m["id"] for m in doc["messages"] if m["role"] == "assistant"
    ]
    assert {by_id[writer.rows[a.id]]["parent_id"] for a in (first, second)} == {
        writer.rows[question.id]
    }
    assert doc["leaf_id"] == writer.rows[second.id] == doc["branch"][-1]


def test_a_database_of_the_previous_schema_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    shutil.copy(SCHEMA_2, path)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    with ChatStore(path, readonly=True) as store:  # read as it is, not written
        old = store.load(1)
        assert contents(old.messages)[::2] == ["What is prefill?", "And decode?"]
        assert old.system == "Be brief."
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    with ChatStore(path) as store:
        chats = {c.id: c for c in store.list_chats()}
        assert (chats[1].messages, chats[2].messages) == (4, 2)
        one, two = store.load(1), store.load(2)
        assert (one.system, two.system) == ("Be brief.", "")
        assert contents(one.messages) == contents(old.messages)
        assert [m.role for m in one.messages] == ["user", "assistant"] * 2
        assert one.messages[1].metrics is not None  # the metrics came through
        assert len(one.children(None)) == 1  # one root: the system prompt
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with ChatStore(path) as store:  # opened again: nothing is migrated twice
        assert len(store.load(1).children(None)) == 1


async def test_a_migrated_chat_continues_on_its_branch(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    shutil.copy(SCHEMA_2, path)
    with ChatStore(path) as store:
        turns = TurnController(ScriptedBackend(text="more"))
        resume(turns, store, 1)
        await ask(turns, "And then?")
        first = turns.conversation.questions()[0]
        await answer(turns, turns.edit(first.id, "What is prefill, really?"))
    with ChatStore(path) as store:
        chat = store.load(1)
        assert contents(chat.messages) == ["What is prefill, really?", "more "]
        old = chat.siblings(chat.messages[0])[0]
        tail = chat.path(chat.children(chat.children(chat.children(old.id)[0].id)[0].id)[0].id)
        assert contents(tail)[1:] == [
            "What is prefill?",
            "Prefill reads the prompt. ",
            "And decode?",
            "Prefill reads the prompt. ",
        ]


WRITER = """
import sys, time
from pathlib import Path
from phasechat.chat.store.database import ChatStore
go = Path(sys.argv[3])
with ChatStore(sys.argv[1]) as store:
    print("ready", flush=True)
    while not go.exists():  # every process starts writing at the same moment
        time.sleep(0.001)
    for n in range(4):
        print(store.create_chat(title=f"{sys.argv[2]}.{n}"))
"""


def test_sixteen_processes_creating_chats_at_once_lose_none(tmp_path: Path) -> None:
    path, go = tmp_path / "chats.db", tmp_path / "go"
    ChatStore(path).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"chat {i}", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(16)
    ]
    for p in procs:  # all loaded and holding the database open
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 16, [err for _, err in results]
    ids = sorted(int(line) for out, _ in results for line in out.split())
    assert ids == list(range(1, 65))
    with ChatStore(path) as store:
        titles = sorted(c.title for c in store.list_chats())
    assert titles == sorted(f"chat {i}.{n}" for i in range(16) for n in range(4))
