"""A chat through the real `RemoteBackend` and session (`TurnController`) against a
stand-in, turn by turn: each answer's events and metrics, and the waterfall shown."""

from __future__ import annotations

from dataclasses import dataclass

from phasechat.backends.events import Event
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.waterfall import Waterfall, waterfall_of

#: the user's two turns
TURNS = ("Why is the sky blue?", "And why are sunsets red?")


@dataclass(frozen=True)
class Answer:
    events: list[Event]
    metrics: Metrics
    waterfall: Waterfall | None


async def chat(
    base_url: str, turns: tuple[str, ...] = TURNS, **config: object
) -> tuple[list[Answer], RemoteBackend]:
    """Send `turns` one after another as a user would; the backend is closed after."""
    backend = RemoteBackend(RemoteConfig(base_url=base_url, **config))  # type: ignore[arg-type]
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    session = TurnController(backend, Settings(max_tokens=64, temperature=0))
    out: list[Answer] = []
    try:
        for text in turns:
            events = [e async for e in session.send(text)]
            m = session.exchanges[-1].metrics
            assert m is not None
            out.append(Answer(events, m, waterfall_of(m)))
    finally:
        await backend.aclose()
    return out, backend
