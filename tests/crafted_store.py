"""Chat databases with a bad cell, built for a test: a real database written by the
store (two chats, the second with two exchanges and their metrics and prompt anatomy),
then one cell overwritten through SQLite as another program or a damaged disk could.

`CASES` names each bad cell: the SQL that writes it, and what the store says of it
(the message's row is filled in). Chat 1 is the untouched neighbour, chat 2 the target;
its first answer is the message made bad, so history continues after it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from phasechat.chat.config.settings import Settings
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.writer import follow
from phasechat.chat.turns import TurnController
from phasechat.telemetry.anatomy import Anatomy, Section
from tests.helpers import ask
from tests.scripted import ScriptedBackend

#: A plausible anatomy, stored with each answer (F8 shows it).
ANATOMY = Anatomy(
    (
        Section("template", None, 4, 0, 4, 1.0),
        Section("system", 0, 3, 0, 3, 0.5),
        Section("new", 1, 5, 0, 5, 0.8),
    ),
    "estimate",
)


@dataclass(frozen=True)
class Case:
    """A bad cell: `sql` (with `:chat` and `:row`, the target chat and its first
    answer, and `:value`), and the words the store's line about it holds."""

    sql: str
    value: object
    says: str


def _anatomy_with(**section: object) -> str:
    data = ANATOMY.as_dict()
    data["prompt_sections"][2].update(section)
    return json.dumps(data)


_CONTENT = "UPDATE messages SET content = :value WHERE id = :row"
_METRICS = "UPDATE messages SET metrics = :value WHERE id = :row"

CASES = {
    "content not UTF-8": Case(
        "UPDATE messages SET content = CAST(:value AS TEXT) WHERE id = :row",
        b"caf\xe9 \xff\xfe answer",
        "its content is not UTF-8 text: unreadable",
    ),
    "content a BLOB": Case(_CONTENT, b"\x00\x01\xffbinary", "its content is binary data (a BLOB)"),
    "metrics {": Case(_METRICS, "{", "its metrics cell is not JSON ('{'): unreadable"),
    "metrics [1,2]": Case(_METRICS, "[1,2]", "its metrics are a list, not an object: unreadable"),
    "metrics output_tokens abc": Case(
        _METRICS,
        '{"output_tokens":"abc"}',
        "its metrics' output_tokens is 'abc', not a count: unreadable",
    ),
    "metrics 100k deep": Case(
        _METRICS, "[" * 100_000 + "]" * 100_000, "its metrics cell is not JSON ('[[[["
    ),
    "anatomy cached 10^30": Case(
        "UPDATE messages SET anatomy = :value WHERE id = :row",
        _anatomy_with(cached_tokens=10**30),
        "its prompt anatomy's cached_tokens is a number too large, not a count: unreadable",
    ),
    "updated 1e300": Case(
        "UPDATE chats SET updated = :value WHERE id = :chat",
        1e300,
        "its update time is 1e+300: unknown",
    ),
    "title not UTF-8": Case(
        "UPDATE chats SET title = CAST(:value AS TEXT) WHERE id = :chat",
        b"caf\xe9 \xff title",
        "its title is not UTF-8 text: unreadable",
    ),
}


@dataclass(frozen=True)
class Crafted:
    """The chats built: `chat` the target, `row` its first answer's row, `neighbour`
    the untouched chat."""

    # (`where` gives the start of the store's line: a case's `says` may stop short)

    chat: int
    row: int
    neighbour: int

    def where(self, case: Case) -> str:
        """The line the store writes about `case`'s cell."""
        where = (
            f"chat {self.chat}" if "chats" in case.sql else f"chat {self.chat}, message {self.row}"
        )
        return f"{where}: {case.says}"


def saved_chats(path: Path) -> Crafted:
    """Chat 1 (one exchange) and chat 2 (two), saved by the store at `path`; every
    answer with its metrics and `ANATOMY`."""

    async def talk(turns: TurnController, *exchanges: tuple[str, str]) -> None:
        for question, answer in exchanges:
            turns.backend.text = answer  # type: ignore[attr-defined]
            await ask(turns, question)

    with ChatStore(path) as store:
        neighbour = store.create_chat()
        turns = TurnController(ScriptedBackend())
        follow(turns, store, neighbour)
        asyncio.run(talk(turns, ("untouched neighbour", "neighbour answer")))
        chat = store.create_chat()
        turns = TurnController(ScriptedBackend(), Settings(system="Be brief."))
        writer = follow(turns, store, chat)
        exchanges = (("first question", "first answer"), ("second question", "second answer"))
        asyncio.run(talk(turns, *exchanges))
        answers = [m for m in turns.conversation.messages if m.role == "assistant"]
        rows = [writer.rows[a.id] for a in answers]
        assert store.error is None
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE messages SET anatomy = ? WHERE role = 'assistant'",
            (json.dumps(ANATOMY.as_dict()),),
        )
    return Crafted(chat, rows[0], neighbour)


def crafted(path: Path, case: Case) -> Crafted:
    """`saved_chats` at `path`, then `case`'s bad cell written."""
    chats = saved_chats(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(case.sql, {"value": case.value, "chat": chats.chat, "row": chats.row})
    return chats
