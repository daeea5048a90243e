"""Rows of the chat database read back, every cell checked where it is read.

A cell holds whatever was last written to the file, by phasechat or by anything else: a
BLOB where text belongs, bytes that are not UTF-8, a metrics cell of `{` or JSON nested
100,000 deep, a time of 1e300. The connection hands text over as it is
(`text_factory`: undecodable bytes kept as lone surrogates, so one bad cell does not
fail the whole query), and each cell is checked here: one that cannot be believed
becomes "unreadable", named with its chat and message id in a line of `notes`, and the
rest of the row, the chat and every other chat stay usable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar, cast, get_args

from phasechat.backends.events import Role
from phasechat.backends.remote.wire_numbers import NOT_JSON, load_json
from phasechat.backends.untrusted import number_in, shown, text_in
from phasechat.chat.conversation import ChatMessage, Status
from phasechat.chat.store.schema import ChatSummary
from phasechat.telemetry.anatomy import Anatomy
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.read_back import Unreadable, anatomy_read_back, metrics_read_back

#: The error shown on an answer that was still streaming when phasechat stopped.
INTERRUPTED = "interrupted: phasechat stopped before this answer finished"
#: The latest time believed (the last second of year 9999, as datetime allows).
_LAST_TIME = 253_402_300_799.0

T = TypeVar("T")


def text_factory(data: bytes) -> str:
    """How the connection reads TEXT: bytes that are not UTF-8 kept as lone
    surrogates (`text_in` refuses them where the cell is read), never a failed query."""
    return data.decode("utf-8", "surrogateescape")


class Cells:
    """Reads one row's cells, noting each one that is unreadable as `where: ...`."""

    def __init__(self, where: str, notes: list[str]) -> None:
        self.where = where
        self.notes = notes

    def bad(self, why: str) -> None:
        """Note a cell that could not be read."""
        self.notes.append(f"{self.where}: {why}")

    def text(self, value: object, what: str) -> str | None:
        """`value` if it is text that can be written out; None (noted) otherwise,
        or None when NULL."""
        if value is None:
            return None
        text = text_in(value)
        if text is not None:
            return text
        self.bad(f"its {what} is {_kind(value)}: unreadable")
        return None

    def time(self, value: object, what: str) -> datetime | None:
        """`value` (seconds since 1970) as a time; None (noted) when it cannot be one."""
        ts = number_in(value, 0.0, _LAST_TIME)
        if ts is None:
            self.bad(f"its {what} time is {shown(value)}: unknown")
            return None
        return datetime.fromtimestamp(ts, UTC)


def _kind(value: object) -> str:
    if isinstance(value, bytes):
        return "binary data (a BLOB), not text"
    if isinstance(value, str):
        return "not UTF-8 text"
    return f"{shown(value)}, not text"


def summary(r: sqlite3.Row, notes: list[str]) -> ChatSummary:
    """A row of `_summaries`' query as a chat summary; its bad cells noted (and named
    in the summary's `unreadable`)."""
    chat_id = int(r["id"])
    mine: list[str] = []
    cells = Cells(f"chat {chat_id}", mine)
    title = cells.text(r["title"], "title")
    if title is None and r["title"] is not None:
        title = "(unreadable title)"
    summary = ChatSummary(
        chat_id,
        title or "(untitled)",
        cells.text(r["system"], "system prompt") or "",
        cells.text(r["backend"], "backend"),
        cells.text(r["model"], "model"),
        int(r["n"]),
        cells.time(r["created"], "creation"),
        cells.time(r["updated"], "update"),
        tuple(mine),
    )
    notes.extend(mine)
    return summary


def message(r: sqlite3.Row, chat_id: int, notes: list[str]) -> ChatMessage:
    """A row of `messages` as a message of chat `chat_id`, every cell checked: an
    unreadable text is shown as "(unreadable: ...)", unreadable metrics or anatomy are
    None; each is noted, with the chat and the message's id."""
    row = r["id"]
    cells = Cells(f"chat {chat_id}, message {row}", notes)
    role = r["role"]
    if role not in get_args(Role):
        cells.bad(f"its role is {shown(role)}: shown as an answer")
        role = "assistant"
    content = cells.text(r["content"], "content")
    if content is None:
        content = f"(unreadable: message {row} of chat {chat_id}: {_kind(r['content'])})"
    status, error = r["status"], cells.text(r["error"], "error")
    if status not in get_args(Status):
        cells.bad(f"its status is {shown(status)}: shown as failed")
        status, error = "error", f"unreadable status {shown(status)}"
    if status == "streaming":
        status, error = "cancelled", INTERRUPTED
    keys = r.keys()
    return ChatMessage(
        cast(Role, role),
        content,
        cells.text(r["backend"], "backend"),
        cells.text(r["model"], "model"),
        cast(Status, status),
        error,
        _metrics(r["metrics"], cells),
        # a database from before thinking models, read-only: no such column
        reasoning=(cells.text(r["reasoning"], "reasoning") or "") if "reasoning" in keys else "",
        anatomy=_anatomy(r["anatomy"], cells) if "anatomy" in keys else None,
    )


def _json_cell(value: object, what: str, cells: Cells, read: Callable[[object], T]) -> T | None:
    """What `read` makes of the JSON a cell holds (None: empty, or unreadable and noted)."""
    if value is None or value == "":
        return None
    text = cells.text(value, what)
    if text is None:
        return None
    data = load_json(text)
    if data is NOT_JSON:
        cells.bad(f"its {what} cell is not JSON ({shown(text)}): unreadable")
        return None
    try:
        return read(data)
    except Unreadable as exc:
        cells.bad(f"{exc}: unreadable")
        return None


def _metrics(value: object, cells: Cells) -> Metrics | None:
    metrics = _json_cell(value, "metrics", cells, metrics_read_back)
    if metrics is not None and metrics.ignored:
        cells.bad(f"ignored {', '.join(metrics.ignored)} in its metrics: not a plausible value")
    return metrics


def _anatomy(value: object, cells: Cells) -> Anatomy | None:
    return _json_cell(value, "prompt anatomy", cells, anatomy_read_back)


def snippet_source(value: object, chat_id: int, row: object) -> str:
    """A search hit's content as text to cut a snippet from."""
    text = text_in(value)
    if text is not None:
        return text
    return f"(unreadable: message {row} of chat {chat_id}: {_kind(value)})"
