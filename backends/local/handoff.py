"""Events from the llama thread to the event loop, without waking the loop per token.

Each token is stamped where it is made (`TextDelta.t_ns`), so delivery can be batched
without touching the timings: the loop is woken at most every `wake_s` for ordinary
events, and at once for the ones that end or report on a request. On two cores a wake-up
per token is a third runnable thread beside llama.cpp's two spinning workers; batching
takes that cost off most tokens.
"""

from __future__ import annotations

import asyncio
import threading
import time

from phasechat.backends.events import Event

WAKE_S = 0.025


class Handoff:
    """A one-producer (llama thread), one-consumer (event loop) event channel."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake_s: float = WAKE_S) -> None:
        self._loop = loop
        self._wake_ns = int(wake_s * 1e9)
        self._lock = threading.Lock()
        self._items: list[Event] = []
        self._ready = asyncio.Event()
        self._woken_at = 0
        self._scheduled = False
        self._ordinary = False  # an ordinary event was put: the first one wakes at once

    def put(self, event: Event, urgent: bool = False) -> None:
        """From the llama thread. An event that is not `urgent` may wait for the next
        one (at most one token interval, or `wake_s`) before the loop sees it; the
        first such event (the first token) does not wait."""
        with self._lock:
            self._items.append(event)
            if not urgent and not self._ordinary:
                urgent = self._ordinary = True
            now = time.perf_counter_ns()
            if self._scheduled or (not urgent and now - self._woken_at < self._wake_ns):
                return
            self._scheduled, self._woken_at = True, now
        self._loop.call_soon_threadsafe(self._ready.set)

    async def take(self) -> list[Event]:
        """On the loop: every event put so far, in order (waits for at least one)."""
        while True:
            self._ready.clear()
            with self._lock:
                items, self._items = self._items, []
                self._scheduled = False
            if items:
                return items
            await self._ready.wait()
