"""`phasechat ask --chat ID [--edit N] [--system TEXT]`: continuing, editing and
re-prompting a saved chat headless, as a separate process each time (as a user would),
and the tree `chats export` prints afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.writer import follow
from phasechat.chat.turns import TurnController
from tests.scripted import ScriptedBackend

FAST = ("--max-tokens", "4", "--n-ctx", "512", "--temperature", "0")


@pytest.fixture(autouse=True)
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home


def phasechat(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args], capture_output=True, text=True, timeout=300
    )


def ask_json(*args: str) -> dict[str, Any]:
    r = phasechat("ask", "--json", *FAST, *args)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def export(chat_id: int) -> dict[str, Any]:
    r = phasechat("chats", "export", str(chat_id), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def shown(doc: dict[str, Any]) -> list[str]:
    """The branch the chat shows: its messages' text, after the system prompt."""
    by_id = {m["id"]: m for m in doc["messages"]}
    return [by_id[i]["content"] for i in doc["branch"][1:]]


@pytest.mark.model
def test_continue_edit_and_reprompt_a_saved_chat() -> None:
    first = ask_json("--system", "Be brief.", "Say hello.")
    chat_id = first["chat_id"]

    second = ask_json("--chat", str(chat_id), "And goodbye?")
    assert second["chat_id"] == chat_id
    doc = export(chat_id)
    assert shown(doc) == ["Say hello.", first["text"], "And goodbye?", second["text"]]
    by_id = {m["id"]: m for m in doc["messages"]}
    assert by_id[second["parent_id"]]["content"] == "And goodbye?"
    assert by_id[second["parent_id"]]["parent_id"] == first["message_id"]  # after the leaf
    assert second["branch"] == second["question_branch"] == {"index": 1, "of": 1}

    edited = ask_json("--chat", str(chat_id), "--edit", "1", "Say hi.")
    assert edited["question_branch"] == {"index": 2, "of": 2}
    doc = export(chat_id)
    assert shown(doc) == ["Say hi.", edited["text"]]
    by_id = {m["id"]: m for m in doc["messages"]}
    question = by_id[edited["parent_id"]]
    old_question = by_id[first["parent_id"]]
    assert question["parent_id"] == old_question["parent_id"]  # siblings under the root
    assert second["message_id"] in by_id  # the old branch is still there, whole

    french = ask_json("--chat", str(chat_id), "--system", "Answer in French.", "Again?")
    doc = export(chat_id)
    roots = [m for m in doc["messages"] if m["parent_id"] is None]
    assert [r["content"] for r in roots] == ["Be brief.", "Answer in French."]
    assert doc["system"] == "Answer in French." and doc["branch"][0] == roots[1]["id"]
    assert shown(doc) == ["Say hi.", edited["text"], "Again?", french["text"]]
    md = phasechat("chats", "export", str(chat_id)).stdout
    assert "Answer in French." in md and "And goodbye?" not in md  # the branch shown only


def dry_then_real(*args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`ask --dry-run --json ARGS`, then the same for real."""
    return ask_json("--dry-run", *args), ask_json(*args)


@pytest.mark.model
def test_dry_run_forecasts_what_the_send_then_reads_on_the_bundled_model() -> None:
    chat_id = str(ask_json("--system", "Be brief.", "Say hello.")["chat_id"])
    ask_json("--chat", chat_id, "And goodbye?")
    rows = export(int(chat_id))["messages"]
    for args in (("--chat", chat_id, "--edit", "2", "Farewell?"), ("--chat", chat_id, "Again?")):
        dry, real = dry_then_real(*args)
        assert dry["dry_run"] and dry["estimated"] is False
        assert dry["prompt_tokens"] == real["prompt_tokens"]
        # a new process: the engine holds nothing yet, and the forecast says so
        assert dry["expected_cached_tokens"] == real["cached_tokens"] == 0
        assert dry["expected_evaluated_tokens"] == real["evaluated_prompt_tokens"]
        assert dry["expected_ttft_ms"] is not None  # from the chat's saved answers
    assert len(export(int(chat_id))["messages"]) == len(rows) + 4  # the dry runs saved nothing


@pytest.mark.server
def test_dry_run_forecasts_what_llama_server_then_reads(
    start_llama_server: Callable[..., str],
) -> None:
    server = ("--backend", "openai", "--base-url", start_llama_server("--parallel", "1"))
    chat_id = str(ask_json(*server, "--system", "Be brief.", "What is a lighthouse?")["chat_id"])
    for q in ("Where are they built?", "Who keeps them?"):
        ask_json(*server, "--chat", chat_id, q)
    for args in (
        ("--chat", chat_id, "--edit", "2", "Where are lighthouses usually built?"),
        ("--chat", chat_id, "And after that?"),
    ):
        dry, real = dry_then_real(*server, *args)
        assert dry["expected_cached_tokens"] > 0  # the server kept the shared start
        assert abs(dry["expected_evaluated_tokens"] - real["evaluated_prompt_tokens"]) <= 2
        assert abs(dry["prompt_tokens"] - real["prompt_tokens"]) <= 2


@pytest.mark.server
def test_a_headless_edit_on_llama_server_carries_the_break_at_the_edited_message(
    start_llama_server: Callable[..., str],
) -> None:
    """Each `ask` is a new process: what the server held is read from the chat's last
    exchange, believed because the server's cached count agrees with it."""
    server = ("--backend", "openai", "--base-url", start_llama_server("--parallel", "1"))
    first = ask_json(*server, "--system", "Be brief.", "What is one plus one?")
    chat_id = str(first["chat_id"])
    second = ask_json(*server, "--chat", chat_id, "What is two plus two?")
    assert second["cached_tokens"] > 0 and second["cache_break"] is None  # a plain next turn
    edited = ("--edit", "2", "Quickly: what is two plus two? Answer briefly.")
    edit = ask_json(*server, "--chat", chat_id, *edited)
    brk = edit["cache_break"]
    assert brk is not None and brk["kind"] == "edit", edit
    # message 3 of the request (0 = the system prompt): the edited question, from its start
    assert (brk["message_index"], brk["char_offset"]) == (3, 0)
    assert "What is two" in brk["held"] and "Quickly" in brk["sent"]
    held = second["prompt_tokens"] + second["output_tokens"]
    assert brk["tokens_read_again"] == held - edit["cached_tokens"]
    # the same edit on a server that never served the chat (it held nothing of it):
    # its cached count does not confirm the chat's last exchange, so no break is claimed
    fresh = (
        "--backend",
        "openai",
        "--base-url",
        start_llama_server("--parallel", "1", "-c", "2048"),
    )
    cold = ask_json(*fresh, "--chat", chat_id, *edited)
    assert cold["cached_tokens"] == 0 and cold["cache_break"] is None


def saved_chat() -> int:
    turns = TurnController(ScriptedBackend())
    turns.replace_conversation(
        Conversation("sys", [ChatMessage("user", "q"), ChatMessage("assistant", "a")])
    )
    with ChatStore() as store:
        chat_id = store.create_chat()
        follow(turns, store, chat_id)
    return chat_id


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--chat", "99", "hi"), "phasechat: no chat with id 99"),
        (("--chat", "x1", "hi"), "phasechat: not a chat id: 'x1'"),
        (("--edit", "1", "hi"), "phasechat: --edit needs --chat ID"),
        (("--chat", "{chat}", "--edit", "2", "hi"), "phasechat: no question 2 in chat"),
        (("--chat", "{chat}", "--edit", "0", "hi"), "phasechat: no question 0 in chat"),
        (("--chat", "{chat}", "   "), "phasechat: empty prompt"),
    ],
)
def test_bad_chat_arguments_are_one_line_and_change_nothing(
    args: tuple[str, ...], message: str
) -> None:
    chat_id = saved_chat()
    with ChatStore() as store:
        before = store.load(chat_id)
    r = phasechat("ask", *FAST, *(a.format(chat=chat_id) for a in args))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(message) and r.stderr.count("\n") == 1, r.stderr
    with ChatStore() as store:
        after = store.load(chat_id)
    assert [m.content for m in after.every()] == [m.content for m in before.every()]


def test_option_prefixes_are_not_guessed() -> None:
    # `--chat` must never be read as `--chat-format`, nor any prefix as a longer option
    r = phasechat("ask", "--max-tok", "3", "hi")
    assert r.returncode == 2 and "unrecognized arguments: --max-tok" in r.stderr
    r = phasechat("--back", "openai", "doctor")
    assert r.returncode == 2 and "--back" in r.stderr
