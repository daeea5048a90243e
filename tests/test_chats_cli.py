"""`phasechat chats` and the exports, run as a user runs them: in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.export import to_json, to_markdown
from phasechat.chat.store.writer import follow
from phasechat.chat.turns import TurnController
from phasechat.telemetry.metrics import metrics_from_dict

ESC = "\x1b]0;pwned\x07\x1b[31m"  # a title change and a colour, as a model might emit
METRICS: dict[str, object] = {
    "ttft_ms": 41.7,
    "decode_tok_s": 88.25,
    "output_tokens": 17,
    "e2e_ms": 230.0,
}


@pytest.fixture(autouse=True)
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home


def phasechat(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args], capture_output=True, text=True, timeout=300
    )


def saved_chat(*messages: ChatMessage, system: str = "Be brief.") -> int:
    """A chat written through the store as a session would write it."""
    turns = TurnController(LocalBackend())  # never started: nothing is generated
    turns.replace_conversation(Conversation(system, messages))
    with ChatStore() as store:
        chat_id = store.create_chat(system=system)
        follow(turns, store, chat_id)
    return chat_id


def story_chat() -> int:
    return saved_chat(
        ChatMessage("user", "Tell me about KV caches"),
        ChatMessage("assistant", f"A cache {ESC}of keys\x9b2J.", "local", "/m/s.gguf",
                    metrics=metrics_from_dict(METRICS)),
        ChatMessage("user", "And then?"),
        ChatMessage("assistant", "Then it", "lab", "qwen", status="streaming"),
    )  # fmt: skip


def test_markdown_export_shows_sources_endings_metrics_and_no_live_controls() -> None:
    chat_id = story_chat()
    with ChatStore() as store:
        md = to_markdown(store.get(chat_id), store.load(chat_id))
    assert md.startswith("# Tell me about KV caches\n")
    assert "## Assistant (local · s.gguf)" in md and "## Assistant (lab · qwen)" in md
    assert "TTFT 42 ms · decode 88.2 tok/s · 17 tokens · total 230 ms" in md
    assert "*interrupted: phasechat stopped before this answer finished*" in md
    assert "> **System:** Be brief." in md
    assert not any(c in md for c in "\x1b\x07\x9b")
    assert "␛]0;pwned␇␛[31m" in md and "\\x9b2J" in md  # shown, not acted on


def test_json_export_keeps_text_exact_and_escapes_controls() -> None:
    chat_id = story_chat()
    r = phasechat("chats", "export", str(chat_id), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stdout for c in "\x1b\x07\x9b")  # safe to print to a terminal
    doc = json.loads(r.stdout)
    assert (doc["id"], doc["title"], doc["system"]) == (
        chat_id,
        "Tell me about KV caches",
        "Be brief.",
    )
    system, user, answer, _, cut = doc["messages"]  # the tree: one branch here
    assert (system["role"], system["content"], system["parent_id"]) == ("system", "Be brief.", None)
    assert user == {
        "id": user["id"],
        "parent_id": system["id"],
        "role": "user",
        "content": "Tell me about KV caches",
        "status": "complete",
    }
    assert doc["branch"] == [m["id"] for m in doc["messages"]] and doc["leaf_id"] == cut["id"]
    assert answer["content"] == f"A cache {ESC}of keys\x9b2J."  # exact after parsing
    assert (answer["backend"], answer["model"]) == ("local", "/m/s.gguf")
    assert {k: answer["metrics"][k] for k in METRICS} == METRICS
    assert (cut["status"], cut["content"], cut["metrics"]) == ("cancelled", "Then it", None)
    assert cut["error"].startswith("interrupted")
    with ChatStore() as store:  # the module's output is what the command printed
        saved = store.open_chat(chat_id)
        assert to_json(store.get(chat_id), saved.conversation, saved.rows) + "\n" == r.stdout


def test_chats_json_lists_every_chat_newest_first() -> None:
    first = story_chat()
    second = saved_chat(ChatMessage("user", "hello"))
    r = phasechat("chats", "--json")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert [c["id"] for c in listed] == [second, first]
    assert listed[1] | {"created": "", "updated": ""} == {
        "id": first, "title": "Tell me about KV caches", "backend": "lab", "model": "qwen",
        "messages": 4, "created": "", "updated": "",
    }  # fmt: skip
    assert listed[1]["created"] <= listed[1]["updated"]


def test_chats_table_rename_search_and_delete() -> None:
    chat_id = saved_chat(ChatMessage("user", f"evil {ESC}title"))
    table = phasechat("chats")
    assert table.returncode == 0 and "\x1b" not in table.stdout
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "UPDATED", "MSGS", "BACKEND", "TITLE"]
    assert row.split()[0] == str(chat_id) and row.rstrip().endswith("␛[31mtitle")

    assert phasechat("chats", "rename", str(chat_id), "Renamed chat").returncode == 0
    assert json.loads(phasechat("chats", "--json").stdout)[0]["title"] == "Renamed chat"
    found = phasechat("chats", "search", "evil", "--json")
    assert [h["chat_id"] for h in json.loads(found.stdout)] == [chat_id]
    assert phasechat("chats", "search", "absent").returncode == 1  # like grep: no hits

    assert phasechat("chats", "delete", str(chat_id)).returncode == 0
    assert json.loads(phasechat("chats", "--json").stdout) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("export", "7"), "phasechat: no chat with id 7"),
        (("rename", "7", "x"), "phasechat: no chat with id 7"),
        (("delete", "7"), "phasechat: no chat with id 7"),
        (("export", "seven"), "phasechat: not a chat id: 'seven' (ids are numbers; see"),
        (("delete", "-1"), "phasechat: not a chat id: '-1'"),
        (("export", str(2**64)), f"phasechat: not a chat id: '{2**64}'"),
        (("export", str(2**63)), f"phasechat: not a chat id: '{2**63}'"),
        (("export", "1_0"), "phasechat: not a chat id: '1_0'"),
        (("export", "\u0661"), "phasechat: not a chat id: '\u0661'"),  # Arabic-Indic one
        (("delete", " 1"), "phasechat: not a chat id: ' 1'"),
    ],
)
def test_bad_ids_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    saved_chat(ChatMessage("user", "only chat"))
    r = phasechat("chats", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(message) and r.stderr.count("\n") == 1


@pytest.mark.model
def test_ask_saves_its_exchange_unless_no_save() -> None:
    r = phasechat("ask", "--json", "--max-tokens", "6", "--n-ctx", "512", "Say hello.")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    listed = json.loads(phasechat("chats", "--json").stdout)
    assert [(c["id"], c["title"], c["messages"], c["backend"]) for c in listed] == [
        (out["chat_id"], "Say hello.", 2, "local")
    ]
    exported = json.loads(
        phasechat("chats", "export", str(out["chat_id"]), "--format", "json").stdout
    )
    _system, question, answer = exported["messages"]
    assert (question["id"], answer["id"]) == (out["parent_id"], out["message_id"])
    assert answer["content"] == out["text"] and answer["status"] == "complete"
    assert answer["metrics"]["output_tokens"] == out["output_tokens"]

    r = phasechat("ask", "--no-save", "--max-tokens", "2", "--n-ctx", "512", "Again.")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(phasechat("chats", "--json").stdout)) == 1
