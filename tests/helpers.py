"""Small helpers shared by the TUI and persistence tests."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

from textual.pilot import Pilot

from phasechat.chat.store.database import default_path
from phasechat.chat.turns import Exchange, TurnController
from phasechat.tui.app import PhasechatApp


async def wait_for(pilot: Pilot[None], condition: Callable[[], bool], limit_s: float = 90) -> None:
    """Let the app run until `condition` holds (a generous limit: no timing is asserted)."""
    async with asyncio.timeout(limit_s):
        while not condition():
            await pilot.pause(0.05)


async def settled(pilot: Pilot[None], app: PhasechatApp, answers: int) -> None:
    """Let the app run until it has `answers` answers and the last is final on screen."""
    await wait_for(pilot, lambda: len(app.turns.exchanges) == answers and not app.chat.generating)
    await pilot.pause()


async def send_each(pilot: Pilot[None], app: PhasechatApp, questions: tuple[str, ...]) -> None:
    """Send each of `questions` in turn, each answer final on screen before the next."""
    for i, question in enumerate(questions, len(app.turns.exchanges) + 1):
        app.chat.send(question)
        await settled(pilot, app, i)


def stored_messages() -> list[sqlite3.Row]:
    """Every message saved in the test's own chat database, in order (the system
    prompts, the roots of the chats' trees, left out)."""
    db = sqlite3.connect(default_path())
    db.row_factory = sqlite3.Row
    try:
        return db.execute(
            "SELECT role, content, status, error FROM messages WHERE role != 'system'"
            " ORDER BY chat_id, position"
        ).fetchall()
    finally:
        db.close()


async def ask(turns: TurnController, prompt: str) -> None:
    """Send `prompt` as the next turn and let the answer stream to its end."""
    await turns.send(prompt)


async def answer(turns: TurnController, exchange: Exchange) -> None:
    """Run a turn begun by `retry`, `edit` or `begin` to its end."""
    await turns.run(exchange)


#: The most prompt tokens a cold run may find cached on the bundled model: the chat
#: template's first tokens (`<|im_start|>system\n[`, 4) and its own random first line
#: (`[3f9a01c2]`, 8 more at most: two such lines may share a leading digit or two).
COLD_MAX = 12
