"""Small helpers shared by the TUI and persistence tests."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

from textual.pilot import Pilot

from phasechat.chat.store import default_path


async def wait_for(pilot: Pilot[None], condition: Callable[[], bool], limit_s: float = 90) -> None:
    """Let the app run until `condition` holds (a generous limit: no timing is asserted)."""
    async with asyncio.timeout(limit_s):
        while not condition():
            await pilot.pause(0.05)


def stored_messages() -> list[sqlite3.Row]:
    """Every message saved in the test's own chat database, in order."""
    db = sqlite3.connect(default_path())
    db.row_factory = sqlite3.Row
    try:
        return db.execute(
            "SELECT role, content, status, error FROM messages ORDER BY chat_id, position"
        ).fetchall()
    finally:
        db.close()
