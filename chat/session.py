"""A chat session: one conversation, one active backend, and the telemetry of each answer.

The TUI and the headless `ask` command both drive a `ChatSession`; it is where a user
prompt becomes a `GenerationRequest`, where the recorder wraps the backend's stream,
and where a partial answer is kept whatever way the stream ends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace

from backends.base import Backend
from backends.events import Event, GenerationRequest, StreamError
from chat.conversation import ChatMessage, Conversation
from telemetry.metrics import Metrics, compute
from telemetry.recorder import Trace, record


class InputError(ValueError):
    """The user's prompt cannot be sent; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Engine parameters the user controls."""

    system: str = "You are a helpful assistant."
    max_tokens: int = 512
    temperature: float = 0.7
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Exchange:
    """One request/answer pair as it happens: the live trace and the answer message."""

    user: ChatMessage
    answer: ChatMessage
    trace: Trace
    metrics: Metrics | None = None
    request: GenerationRequest | None = None


class ChatSession:
    """Ties a backend to a conversation and to telemetry."""

    def __init__(self, backend: Backend, settings: Settings | None = None) -> None:
        self.backend = backend
        self.settings = settings or Settings()
        self.conversation = Conversation(system=self.settings.system)
        self.exchanges: list[Exchange] = []
        self.current: Exchange | None = None

    def update_settings(self, **changes: object) -> None:
        """Change engine parameters; the system prompt applies from the next send."""
        self.settings = replace(self.settings, **changes)  # type: ignore[arg-type]
        self.conversation.system = self.settings.system

    def request(self) -> GenerationRequest:
        """The request the next send would make, from the conversation as it stands."""
        s = self.settings
        return GenerationRequest(
            messages=self.conversation.prompt_messages(),
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            stop=s.stop,
            seed=s.seed,
        )

    def begin(self, prompt: str) -> Exchange:
        """Add `prompt` as a user turn and an empty answer; `run` streams it.

        An empty prompt raises `InputError` before anything is added.
        """
        if not prompt.strip():
            raise InputError("empty prompt: type a message first")
        backend = self.backend
        user = self.conversation.add(ChatMessage("user", prompt))
        request = self.request()
        count = backend.count_tokens(request.messages)
        answer = self.conversation.add(
            ChatMessage("assistant", "", backend.name, backend.model, status="streaming")
        )
        trace = Trace(
            backend=backend.name,
            model=backend.model,
            max_tokens=request.max_tokens,
            prompt_estimate=count.tokens,
            prompt_estimate_exact=not count.estimated,
        )
        exchange = Exchange(user, answer, trace, request=request)
        self.exchanges.append(exchange)
        return exchange

    async def run(self, exchange: Exchange) -> AsyncGenerator[Event, None]:
        """Stream the answer of `exchange`'s request through the recorder.

        Closing the iterator early cancels the generation; the partial answer stays in
        the conversation marked "cancelled".
        """
        self.current = exchange
        try:
            assert exchange.request is not None
            async for event in record(self.backend.stream(exchange.request), exchange.trace):
                yield event
        finally:
            self._finish(exchange)

    async def send(self, prompt: str) -> AsyncGenerator[Event, None]:
        """`begin` + `run`: add `prompt` and stream the answer's events."""
        exchange = self.begin(prompt)
        async for event in self.run(exchange):
            yield event

    def _finish(self, exchange: Exchange) -> None:
        trace, answer = exchange.trace, exchange.answer
        trace.cancel(time.perf_counter_ns())  # no-op when a terminal event arrived
        answer.content = trace.text
        answer.model = trace.model
        if isinstance(trace.error, StreamError):
            answer.status, answer.error = "error", trace.error.message
        elif trace.finish == "cancelled":
            answer.status = "cancelled"
        else:
            answer.status = "complete"
        exchange.metrics = compute(trace)
        answer.metrics = exchange.metrics.as_dict()
        self.current = None

    def switch_backend(self, backend: Backend) -> None:
        """Answer with `backend` from the next send on; the conversation carries over."""
        self.backend = backend
