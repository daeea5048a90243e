"""Every cell read back from the chat database is checked where it is read: a bad one
becomes "unreadable", named with its chat and message id, and the rest of the chat and
every other chat stay usable: `chats` list, export and search, `ask --chat`, the chat
opened in the TUI (F3) and F8 on its answers. What is written out is strict JSON and
cannot reorder a terminal's line: unknown figures are "unknown" in text, `null` in
JSON, and bidi controls are escaped.

The databases are built by tests/crafted_store.py: real files written by the store,
then one cell overwritten. Run as a user runs them: `phasechat` in a subprocess, the
app through Textual's pilot.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from contextlib import closing
from typing import Any

import pytest
from textual.widgets import OptionList

from phasechat.chat.store.database import ChatStore, default_path
from phasechat.chat.store.export import metrics_line
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.records import dumps
from phasechat.tui.screens.prompt_view import PromptView
from phasechat.tui.widgets.chat_widgets import MessageView
from tests.crafted_store import ANATOMY, CASES, Case, Crafted, crafted, saved_chats
from tests.fault_server import fault_server_thread
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend
from tests.test_cli import phasechat
from tests.test_tui_hostile import App, open_chats, said

#: The cells that belong to a message (the others are the chat's own).
MESSAGE_CASES = [name for name, case in CASES.items() if "messages" in case.sql]


def no_traceback(r: Any) -> None:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


def warned(stderr: str, chats: Crafted, case: Case) -> bool:
    """Whether `stderr` has the warning line naming `case`'s cell."""
    start = f"phasechat: warning: {chats.where(case)}"
    return any(line.startswith(start) for line in stderr.splitlines())


def strict_json(text: str) -> Any:
    """`text` parsed as JSON that any parser takes: no NaN, no Infinity."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in the JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_cell_is_named_and_chats_lists_exports_and_searches_the_rest(name: str) -> None:
    case = CASES[name]
    chats = crafted(default_path(), case)

    listed = phasechat("chats")
    no_traceback(listed)
    lines = listed.stdout.splitlines()[1:]
    assert len(lines) == 2, listed.stdout  # both chats, the bad one too
    assert any("untouched neighbour" in line for line in lines)
    if "title" in name:
        assert any(line.endswith("(unreadable title)") for line in lines)
    if "updated" in name:
        assert any(" unknown " in line for line in lines)
        listing = strict_json(phasechat("chats", "--json").stdout)
        assert {c["id"]: c["updated"] for c in listing}[chats.chat] is None
    if "messages" not in case.sql:  # the chat's own cell: said when listed
        assert warned(listed.stderr, chats, case), listed.stderr

    md = phasechat("chats", "export", str(chats.chat))
    no_traceback(md)
    for text in ("Be brief.", "first question", "second question", "second answer"):
        assert text in md.stdout
    assert warned(md.stderr, chats, case), md.stderr
    if "content" in name:
        assert f"(unreadable: message {chats.row} of chat {chats.chat}: " in md.stdout
        assert "first answer" not in md.stdout
    else:
        assert "first answer" in md.stdout

    doc = strict_json(phasechat("chats", "export", str(chats.chat), "--format", "json").stdout)
    by_id = {m["id"]: m for m in doc["messages"]}
    assert [by_id[i]["role"] for i in doc["branch"]] == ["system"] + ["user", "assistant"] * 2
    bad = by_id[chats.row]
    if "metrics" in name:
        assert bad["metrics"] is None
        last = doc["branch"][-1]  # the other answer's metrics, as they were written
        with closing(sqlite3.connect(default_path())) as db:
            (written,) = db.execute("SELECT metrics FROM messages WHERE id = ?", (last,)).fetchone()
        assert by_id[last]["metrics"] == json.loads(written)
    if "anatomy" in name:
        assert "prompt_sections" not in bad and "prompt_sections" in by_id[doc["branch"][-1]]

    found = phasechat("chats", "search", "answer")
    no_traceback(found)
    assert "neighbour answer" in found.stdout and "second answer" in found.stdout
    if "content" in name:  # a search that finds the bad message itself names it
        word = "binary" if "BLOB" in name else "answer"
        hit = phasechat("chats", "search", word)
        no_traceback(hit)
        assert (
            f"of chat {chats.chat}: {'binary data' if 'BLOB' in name else 'not UTF-8'}"
            in hit.stdout
        )


@pytest.mark.parametrize("name", MESSAGE_CASES)
def test_ask_chat_sends_the_history_around_a_bad_message(name: str) -> None:
    chats = crafted(default_path(), CASES[name])
    with fault_server_thread() as srv:
        r = phasechat(
            "ask", "--backend", "openai", "--base-url", srv.base_url, "--model", "ok-2",
            "--chat", str(chats.chat), "third question",
        )  # fmt: skip
        sent = [q["messages"] for q in srv.requests if "messages" in q]
    no_traceback(r)
    assert warned(r.stderr, chats, CASES[name]), r.stderr
    (messages,) = sent
    said_ = [m["content"] for m in messages]
    assert said_[0] == "Be brief." and said_[1] == "first question"
    assert said_[3:] == ["second question", "second answer ", "third question"]
    with ChatStore(readonly=True) as store:  # saved after the bad message, on its branch
        assert [m.content for m in store.load(chats.chat).messages][-2:] == [
            "third question",
            "tok tok ",
        ]


def option_index(options: OptionList, chat_id: int) -> int:
    ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
    return ids.index(str(chat_id))


@pytest.mark.parametrize("name", sorted(CASES))
async def test_the_tui_opens_a_chat_with_a_bad_cell_and_f8_goes_on(name: str) -> None:
    case = CASES[name]
    chats = await asyncio.to_thread(crafted, default_path(), case)  # (it runs a loop of its own)
    app = App(ScriptedBackend(text="ok"))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_chats(app, pilot)
        options = screen.query_one(OptionList)
        options.highlighted = option_index(options, chats.chat)
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: "second answer" in [m.content.strip() for m in app.turns.conversation.messages],
        )
        await pilot.pause()
        assert app.is_running and app.workspace.chat_id() == chats.chat
        if "messages" in case.sql:
            assert any(chats.where(case) in line for line in said(app)), said(app)
        views = [v for v in app.query(MessageView) if v.message.role == "assistant"]
        assert len(views) == 2
        views[0].focus()  # the first answer: F8 shows its prompt, or the next one's
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptView))
        view = app.screen
        assert isinstance(view, PromptView)
        assert view.anatomy == ANATOMY  # read back as it was written
        # a bad anatomy is not drawn (F8 goes on to the next answer's prompt)
        first, _ = (m for m in app.turns.conversation.messages if m.role == "assistant")
        assert (first.anatomy is None) == ("anatomy" in name)
        await pilot.press("escape")
        app.chat.send("third question")  # the chat goes on after the bad cell
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        assert app.is_running


#: Stored figures no answer could have: NaN, -infinity, 1e308, a negative time.
IMPOSSIBLE = {"ttft_ms": math.nan, "prefill_tok_s": -math.inf, "decode_tok_s": 1e308, "e2e_ms": -5}


def test_impossible_stored_figures_export_as_unknown_and_null() -> None:
    chats = saved_chats(default_path())
    with closing(sqlite3.connect(default_path())) as db, db:
        (raw,) = db.execute("SELECT metrics FROM messages WHERE id = ?", (chats.row,)).fetchone()
        stored = {**json.loads(raw), **IMPOSSIBLE}
        db.execute("UPDATE messages SET metrics = ? WHERE id = ?", (json.dumps(stored), chats.row))
    assert "NaN" in json.dumps(stored) and "-Infinity" in json.dumps(stored)  # as written

    md = phasechat("chats", "export", str(chats.chat))
    no_traceback(md)
    (line,) = [x for x in md.stdout.splitlines() if x.startswith("<sub>TTFT unknown")]
    assert line.startswith("<sub>TTFT unknown · prefill unknown · decode unknown · ")
    assert line.endswith(" · total unknown</sub>")
    for raw_figure in ("nan", "inf", "1000000000", "-5"):
        assert raw_figure not in line.lower()
    assert md.stderr == (  # named, with its chat and row
        f"phasechat: warning: chat {chats.chat}, message {chats.row}: ignored ttft_ms (nan),"
        " e2e_ms (-5), prefill_tok_s (-inf), decode_tok_s (1e+308) in its metrics:"
        " not a plausible value\n"
    )

    out = phasechat("chats", "export", str(chats.chat), "--format", "json").stdout
    metrics = {m["id"]: m for m in strict_json(out)["messages"]}[chats.row]["metrics"]
    assert {k: metrics[k] for k in IMPOSSIBLE} == dict.fromkeys(IMPOSSIBLE)
    assert metrics["output_tokens"] == stored["output_tokens"]  # the plausible ones kept
    assert sorted(x.split(" ")[0] for x in metrics["ignored"]) == sorted(IMPOSSIBLE)


def test_json_out_is_strict_whatever_it_is_given() -> None:
    assert dumps({"a": math.nan, "b": [-math.inf, 1.5]}) == '{"a": null, "b": [null, 1.5]}'
    unknown = metrics_from_dict({"output_tokens": 3, "ignored": ["ttft_ms (nan)"]})
    assert metrics_line(unknown) == "TTFT unknown · 3 tokens"


#: Every bidi control: the marks, embeddings, overrides and isolates.
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_bidi_controls_are_escaped_in_ask_json_and_the_json_export() -> None:
    prompt = "file\u202egnp.exe " + BIDI
    with fault_server_thread() as srv:
        r = phasechat(
            "ask", "--json", "--backend", "openai", "--base-url", srv.base_url,
            "--model", "echo", prompt,
        )  # fmt: skip
    no_traceback(r)
    exported = phasechat(
        "chats", "export", str(strict_json(r.stdout)["chat_id"]), "--format", "json"
    )
    for out in (r.stdout, exported.stdout):
        assert not any(ch in out for ch in BIDI)  # nothing raw reaches the terminal
        assert "file\\u202egnp.exe" in out
        assert all(f"\\u{ord(ch):04x}" in out for ch in BIDI)
    assert strict_json(r.stdout)["text"] == prompt  # the JSON still round-trips exactly
    doc = strict_json(exported.stdout)
    assert [m["content"] for m in doc["messages"]][1:] == [prompt, prompt]
