"""A chat session: one conversation, one active backend, and the telemetry of each answer.

The TUI and the headless `ask` command both drive a `ChatSession`; it is where a user
prompt becomes a `GenerationRequest`, where the recorder wraps the backend's stream,
and where a partial answer is kept whatever way the stream ends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from phasechat.backends.base import Backend, PromptRefused
from phasechat.backends.events import (
    Event,
    GenerationRequest,
    KVStats,
    ReasoningDelta,
    StreamError,
    TextDelta,
)
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.settings import Settings
from phasechat.chat.text import is_text
from phasechat.chat.trim_types import SendPlan, TrimStats
from phasechat.chat.trimmer import Trimmer
from phasechat.telemetry.export import record
from phasechat.telemetry.live import Live, finished, snapshot
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.telemetry.recorder import Trace
from phasechat.telemetry.recorder import record as recorded


class InputError(ValueError):
    """The user's prompt cannot be sent; the message says why, in one line."""


@dataclass
class Exchange:
    """One request/answer pair as it happens: the live trace and the answer message."""

    user: ChatMessage
    answer: ChatMessage
    trace: Trace
    metrics: Metrics | None = None
    request: GenerationRequest | None = None
    #: this send is the first to use a new history summary (its prefix cache restarts)
    trimmed: bool = False
    #: one line about trimming the UI should show ("summary not ready: sent full history")
    trim_note: str | None = None
    #: time spent waiting for a summary before the request was sent (not in TTFT)
    trim_wait_ms: float | None = None
    #: prompt tokens the summary saved this send (full history minus what was sent)
    tokens_cut: int = 0
    trim_plan: SendPlan | None = None

    # What the UI reads while the answer streams (it never reads the recorder's Trace).
    @property
    def text(self) -> str:
        """The answer's text so far."""
        return self.trace.text

    @property
    def reasoning(self) -> str:
        """The thinking so far ('' for a model that does not think)."""
        return self.trace.reasoning

    @property
    def kv(self) -> KVStats | None:
        """The engine's KV-cache figures, where it reports them."""
        return self.trace.kv

    def live(self, now_ns: int | None = None) -> Live:
        """The live figures at `now_ns` (default: now); once the answer is finished, its
        final figures (the same numbers as its metrics)."""
        live = snapshot(self.trace, time.perf_counter_ns() if now_ns is None else now_ns)
        return finished(live, self.metrics) if self.metrics is not None else live

    def token_times_ms(self) -> list[float]:
        """When each token (or chunk) arrived, in ms on the process clock."""
        return [t / 1e6 for t in self.trace.times]

    def export_record(self, index: int) -> dict[str, object]:
        """The answer's history record (every metric and per-token times) for exports."""
        assert self.metrics is not None
        return record(index, self.user.content, self.metrics, self.trace)


class SessionListener(Protocol):
    """Told about every change to the conversation (persistence listens here)."""

    def message_added(self, message: ChatMessage) -> None:
        """A new message (a user turn, or an answer that starts streaming)."""

    def message_updated(self, message: ChatMessage, final: bool) -> None:
        """More streamed text (at most every FLUSH_S), or the final state (final=True)."""


#: How often streamed text is handed to listeners: a crash loses at most this much.
FLUSH_S = 0.5


class ChatSession:
    """Ties a backend to a conversation and to telemetry."""

    def __init__(self, backend: Backend, settings: Settings | None = None) -> None:
        self.backend = backend
        self.settings = settings or Settings()
        self.conversation = Conversation(system=self.settings.system)
        self.exchanges: list[Exchange] = []
        self.current: Exchange | None = None
        self.listeners: list[SessionListener] = []
        self.trimmer = Trimmer()
        #: `GenerationRequest.batch_s` of the next sends (the TUI sets its draw interval)
        self.batch_s: float | None = None

    def _added(self, message: ChatMessage) -> ChatMessage:
        self.conversation.add(message)
        for listener in self.listeners:
            listener.message_added(message)
        return message

    def _updated(self, message: ChatMessage, final: bool) -> None:
        for listener in self.listeners:
            listener.message_updated(message, final)

    def update_settings(self, settings: Settings | None = None, /, **changes: Any) -> None:
        """Use `settings` (default: the current ones) with `changes`, from the next send;
        the system prompt too."""
        self.settings = replace(settings or self.settings, **changes)
        self.conversation.system = self.settings.system

    def request(self) -> GenerationRequest:
        """The request the next send would make, from the conversation as it stands."""
        s = self.settings
        return GenerationRequest(
            messages=self.trimmer.prompt_messages(self.conversation),
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            stop=s.stop,
            seed=s.seed,
            batch_s=self.batch_s,
        )

    def begin(self, prompt: str) -> Exchange:
        """Add `prompt` as a user turn and an empty answer; `run` streams it.

        An empty prompt raises `InputError` before anything is added.
        """
        if not prompt.strip():
            raise InputError("empty prompt: type a message first")
        if not is_text(prompt):
            raise InputError("the prompt is not valid UTF-8: not sent")
        backend = self.backend
        user = self._added(ChatMessage("user", prompt))
        try:
            plan = self.trimmer.prepare(backend, self.conversation, self.settings.max_tokens)
            request = self.request()
            trace = self._trace_for(request)
        except PromptRefused as exc:  # kept and saved, not sent; the chat goes on
            user.status, user.error = "error", str(exc)
            self._updated(user, final=True)
            raise InputError(str(exc)) from None
        answer = self._added(
            ChatMessage("assistant", "", backend.name, backend.model, status="streaming")
        )
        exchange = Exchange(user, answer, trace, request=request)
        self._planned(exchange, plan)
        self.exchanges.append(exchange)
        return exchange

    def _trace_for(self, request: GenerationRequest) -> Trace:
        """A new trace for sending `request` on the active backend: our own count of its
        prompt, and the window (one the server named when it refused a prompt, if any)."""
        backend = self.backend
        count = backend.count_tokens(request.messages)
        learned = self.trimmer.windows.get(backend.name)
        return Trace(
            backend=backend.name,
            model=backend.model,
            max_tokens=request.max_tokens,
            prompt_estimate=count.tokens,
            prompt_estimate_exact=not count.estimated,
            window=learned or backend.context_window,
            window_source="the server's refusal" if learned else backend.context_source,
        )

    def _planned(self, exchange: Exchange, plan: SendPlan) -> None:
        exchange.trimmed, exchange.trim_note = plan.trimmed, plan.note
        exchange.trim_wait_ms = plan.waited_ms
        exchange.trim_plan = plan
        if not plan.wait and exchange.request is not None:
            estimate = exchange.trace.prompt_estimate or 0
            exchange.tokens_cut = self.trimmer.sent(self.backend, self.conversation, estimate)

    async def _settle(self, exchange: Exchange) -> None:
        """Wait for the summary this send needs (outside TTFT, recorded on the exchange)."""
        plan = exchange.trim_plan
        if plan is None or not plan.wait:
            return
        exchange.trace.t_queued = time.perf_counter_ns()  # shown as its own phase
        plan = await self.trimmer.wait(plan)
        exchange.request = request = self.request()
        count = self.backend.count_tokens(request.messages)
        exchange.trace.prompt_estimate = count.tokens
        exchange.trace.prompt_estimate_exact = not count.estimated
        self._planned(exchange, plan)

    async def run(self, exchange: Exchange) -> AsyncGenerator[Event, None]:
        """Stream the answer of `exchange`'s request through the recorder.

        Closing the iterator early cancels the generation; the partial answer stays in
        the conversation marked "cancelled".
        """
        self.current = exchange
        try:
            await self._settle(exchange)
            async for event in self._attempt(exchange):
                yield event
            if await self._refit(exchange):  # refused as too long: trimmed, sent once more
                async for event in self._attempt(exchange):
                    yield event
        finally:
            self._finish(exchange)

    async def _attempt(self, exchange: Exchange) -> AsyncGenerator[Event, None]:
        """One request of `exchange` through the recorder, its text saved as it streams."""
        trace, answer = exchange.trace, exchange.answer
        assert exchange.request is not None
        flush_ns = int(FLUSH_S * 1e9)
        next_flush = time.perf_counter_ns() + flush_ns
        async for event in recorded(self.backend.stream(exchange.request), trace):
            if (
                self.listeners
                and isinstance(event, TextDelta | ReasoningDelta)
                and trace.t_last_token is not None
                and trace.t_last_token >= next_flush
            ):
                next_flush = trace.t_last_token + flush_ns
                answer.content = trace.text
                answer.reasoning = trace.reasoning
                self._updated(answer, final=False)
            yield event

    async def _refit(self, exchange: Exchange) -> bool:
        """After a server refused the prompt as longer than its window: learn the window
        it named, trim the history to fit it, and prepare one more request. False when
        there is nothing to trim (then the refusal stands)."""
        error = exchange.trace.error
        if error is None or error.kind != "context_overflow" or not self.trimmer.enabled:
            return False
        n_ctx = error.detail.get("n_ctx")
        if isinstance(n_ctx, int) and n_ctx > 0:
            self.trimmer.windows[self.backend.name] = n_ctx
        plan = await self.trimmer.refit(self.backend, self.conversation, self.settings.max_tokens)
        if plan is None:
            return False
        request = self.request()
        exchange.trace = self._trace_for(request)  # the refused request's trace is replaced
        exchange.trace.notices.append(
            f"the server refused the prompt as longer than its window: {error.message}; "
            "trimmed the history and sent it again"
        )
        exchange.request = request
        exchange.trimmed, exchange.trim_note = True, plan.note
        return True

    async def send(self, prompt: str) -> AsyncGenerator[Event, None]:
        """`begin` + `run`: add `prompt` and stream the answer's events."""
        exchange = self.begin(prompt)
        async for event in self.run(exchange):
            yield event

    def _finish(self, exchange: Exchange) -> None:
        trace, answer = exchange.trace, exchange.answer
        now = time.perf_counter_ns()
        trace.t_sent = trace.t_sent or now  # cancelled while waiting for a summary
        trace.cancel(now)  # no-op when a terminal event arrived
        answer.content = trace.text
        answer.reasoning = trace.reasoning
        answer.model = trace.model
        if isinstance(trace.error, StreamError):
            answer.status, answer.error = "error", trace.error.message
            if trace.error.kind == "context_overflow" or not answer.content:
                # Kept, shown and saved, but not sent again (in_prompt): a strict server
                # would refuse every later request with two user turns in a row, and a
                # prompt too long for the window would overflow again. Ctrl+R resends it.
                exchange.user.status, exchange.user.error = "error", trace.error.message
                self._updated(exchange.user, final=True)
        elif trace.finish == "cancelled":
            answer.status = "cancelled"
        else:
            answer.status = "complete"
        exchange.metrics = compute(trace)
        answer.metrics = exchange.metrics
        self.current = None
        self._updated(answer, final=True)
        if answer.status != "error":
            self.trimmer.after_answer(self.backend, self.conversation, self.settings.max_tokens)

    def trim_stats(self) -> TrimStats:
        """The trimmer's figures for the telemetry panel."""
        answers = [e.metrics for e in self.exchanges]
        return self.trimmer.stats(self.backend, self.settings.max_tokens, answers)

    async def aclose(self) -> None:
        """Stop background work (a summary in flight); the backend stays open."""
        await self.trimmer.aclose()

    def abandon(self, exchange: Exchange) -> None:
        """Close an exchange whose `run` never started (cancelled before its first event):
        it is finished as cancelled, so nothing is left "streaming"."""
        if exchange.metrics is None:
            self._finish(exchange)

    def switch_backend(self, backend: Backend) -> None:
        """Answer with `backend` from the next send on; the conversation carries over."""
        self.backend = backend
