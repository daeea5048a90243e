"""A backend that replays canned events: only for rendering tests (snapshots), where
real timings would make every picture different."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from phasechat.backends.base import LoadState, RenderedPrompt, TokenCount
from phasechat.backends.events import Event, Finished, GenerationRequest, Message, TextDelta


class ScriptedBackend:
    exact_token_counts = False
    serial = False
    shares_cpu = False
    context_window: int | None = None
    context_source = None

    def __init__(self, name: str = "scripted", text: str = "Hello.", gap_s: float = 0.0) -> None:
        """`gap_s`: a pause before each word after the first (0: all at once, a burst
        that has no decode rate: telemetry/metrics.decode_rate)."""
        self._name = name
        self.text = text
        self.gap_s = gap_s
        self.closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def model(self) -> str:
        return "scripted-model"

    @property
    def state(self) -> LoadState:
        return "ready"

    @property
    def state_detail(self) -> str:
        return "scripted"

    async def start(self) -> None:
        return None

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        return None

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        return None  # no tokenizer of its own: the prompt's sections are estimated

    async def warm(self, messages: tuple[Message, ...]) -> int:
        return 0

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        for i, word in enumerate(self.text.split(" ")):
            if i and self.gap_s:
                await asyncio.sleep(self.gap_s)
            yield TextDelta(word + " ")
        yield Finished("stop")

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        return TokenCount(sum(len(m.content) // 4 + 3 for m in messages), estimated=True)

    async def aclose(self) -> None:
        self.closed = True
