"""The recorder: stamps every backend event on arrival, keeps one `Trace` per request.

Only the recorder writes a `Trace`: the backend's events through `observe`, and what the
turn knows before the request goes (`queue`, `estimate_prompt`) or when it is abandoned
(`cancel`) through its methods; everyone else reads it.

A text event that carries the time it was made (`TextDelta.t_ns`: the local backend
stamps each token on the llama thread) is timed by that instead of its arrival, so
tokens queued behind a busy UI keep their real spacing.

The hot path (`observe`) does a clock read, an append and a few integer updates per
event; everything derived (rates, percentiles) is computed on demand by
`telemetry.metrics`, at the UI's refresh rate or once at the end.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from phasechat.backends.events import (
    AnswerTokens,
    CpuBusy,
    EngineThreads,
    Event,
    Finished,
    FinishReason,
    KVStats,
    ModelLoaded,
    ModelLoading,
    Notice,
    PrefillProgress,
    PromptEvaluated,
    ReasoningDelta,
    ResponseStarted,
    ServerAccount,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)

#: Token times kept per request before the oldest-first decimation starts (8 bytes each).
MAX_TIMES = 131_072
#: The least time any engine takes to decode a token for one stream (0.2 ms: 5,000 tok/s,
#: beyond the fastest served decode). Tokens that come closer together than this were
#: decoded earlier and handed on at once (a proxy that buffers the stream): a burst.
BURST_GAP_NS = 200_000


@dataclass
class Trace:
    """Everything measured about one request. Times are `perf_counter_ns` values."""

    backend: str
    model: str
    max_tokens: int = 0
    prompt_estimate: int | None = None  # our own count, before sending
    prompt_estimate_exact: bool = False
    #: the backend's context window when the request was sent (None: unknown)
    window: int | None = None
    window_source: str | None = None
    t_sent: int = 0
    #: set while the request waits before it is sent (for a history summary): since when
    t_queued: int | None = None
    t_first_byte: int | None = None
    #: the request waited for the model to load (a local model still loading when it
    #: was sent): since when, and when the model was ready (the prefill starts there)
    t_loading: int | None = None
    t_loaded: int | None = None
    #: the time the request spent opening its connection (remote; see ResponseStarted)
    connect_ms: float | None = None
    #: when the request's body was all written (remote, where the transport said)
    t_body_sent: int | None = None
    #: the second token event: with the first, how the stream starts (a burst, a pause)
    t_second_token: int | None = None
    #: first and last token of any kind (thinking or answer): the decode window
    t_first_token: int | None = None
    t_last_token: int | None = None
    t_first_answer: int | None = None  # first answer token (TTFO)
    t_first_reasoning: int | None = None
    t_last_reasoning: int | None = None
    t_done: int | None = None
    #: a token the server counted but sent no text for, at the end (see `Finished`)
    t_silent_token: int | None = None
    #: arrival time of each token event (answer or thinking; token or chunk), ns after
    #: t_sent; decimated by `stride` once it holds MAX_TIMES entries (bounded memory).
    times: array[int] = field(default_factory=lambda: array("q"))
    #: beside each entry of `times`: the event's tokens (the backend's count; 0: it did
    #: not say), its characters, and whether it was thinking (1) or answer (0)
    sizes: array[int] = field(default_factory=lambda: array("I"))
    lengths: array[int] = field(default_factory=lambda: array("I"))
    kinds: array[int] = field(default_factory=lambda: array("b"))
    stride: int = 1
    deltas: int = 0  # token events of both kinds
    #: the longest run of token events that came faster than BURST_GAP_NS a token, all
    #: together (a pause inside it that the run's pace absorbs does not end it: a burst
    #: parsed over several reads): how many gaps it holds, how long it lasted
    #: (see `figures.decode_rate`)
    burst_gaps: int = 0
    burst_ns: int = 0
    tokens: int = 0  # tokens the backend vouched for, thinking included (local: exact)
    tokens_known: bool = True
    chars: int = 0  # of the answer
    #: characters of the first answer event: the character rate's window starts after it
    chars_first: int = 0
    text_parts: list[str] = field(default_factory=list)
    reasoning_deltas: int = 0
    reasoning_tokens: int = 0  # the thinking's share of `tokens`
    reasoning_tokens_known: bool = True
    reasoning_parts: list[str] = field(default_factory=list)
    prompt: PromptEvaluated | None = None
    usage: Usage | None = None
    server: ServerTimings | None = None
    account: ServerAccount | None = None
    progress: PrefillProgress | None = None
    kv: KVStats | None = None
    #: the local engine's thread count now, and how often it changed mid-answer
    threads: EngineThreads | None = None
    thread_changes: int = 0
    #: how busy other processes kept the CPUs while the local engine decoded
    cpu_busy: CpuBusy | None = None
    notices: list[str] = field(default_factory=list)
    #: the answer's token ids, where the engine said (the local backend, at the end)
    answer_tokens: AnswerTokens | None = None
    #: the notices that name a server's figures that were not believed
    doubts: list[str] = field(default_factory=list)
    finish: FinishReason | None = None
    error: StreamError | None = None
    _skip: int = 0
    _run: int = 0  # the gaps of the run of close token events going on now
    _run_tokens: int = 0  # and the tokens they brought
    _run_start: int = 0
    _prev_ns: int | None = None  # the last token event that carried a token

    @property
    def text(self) -> str:
        """The answer so far (joined on demand; cheap enough at UI rates)."""
        if len(self.text_parts) > 1:
            self.text_parts[:] = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""

    @property
    def reasoning(self) -> str:
        """The thinking so far (a thinking model's chain of thought; '' for others)."""
        parts = self.reasoning_parts
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    @property
    def done(self) -> bool:
        return self.t_done is not None

    def observe(self, event: Event, now: int) -> None:
        """Record one event that arrived at `now` (ns)."""
        match event:
            case TextDelta(text=text, tokens=tokens, t_ns=made):
                now = made if made is not None else now
                if self.t_first_answer is None:
                    self.t_first_answer = now
                    self.chars_first = len(text)
                self._token(now, tokens, len(text), 0)
                if text:
                    self.text_parts.append(text)
                    self.chars += len(text)
            case ReasoningDelta(text=text, tokens=tokens, t_ns=made):
                now = made if made is not None else now
                if self.t_first_reasoning is None:
                    self.t_first_reasoning = now
                self.t_last_reasoning = now
                self.reasoning_deltas += 1
                if tokens is None:
                    self.reasoning_tokens_known = False
                else:
                    self.reasoning_tokens += tokens
                self._token(now, tokens, len(text), 1)
                if text:
                    self.reasoning_parts.append(text)
            case ModelLoading():
                self.t_loading = now
            case ModelLoaded(t_ns=ended):
                self.t_loaded = ended if ended is not None else now
            case ResponseStarted(connect_ms=connect_ms, t_body_sent_ns=body_sent):
                self.t_first_byte = now
                self.connect_ms = connect_ms
                self.t_body_sent = body_sent
            case PromptEvaluated():
                self.prompt = event
            case PrefillProgress():
                self.progress = event
            case Usage():
                self.usage = event
            case ServerTimings():
                self.server = event
            case ServerAccount():
                self.account = event
            case KVStats():
                self.kv = event
            case EngineThreads():
                if self.threads is not None and event.threads != self.threads.threads:
                    self.thread_changes += 1
                self.threads = event
            case CpuBusy():
                self.cpu_busy = event
            case Notice(text=text, doubt=doubt):
                self.notices.append(text)
                if doubt:
                    self.doubts.append(text)
            case AnswerTokens():
                self.answer_tokens = event
            case Finished(reason=reason, t_silent_ns=silent, t_ns=ended):
                self.finish = reason
                self.t_done = ended if ended is not None else now
                self.t_silent_token = silent
            case StreamError():
                self.error = event
                self.finish = "error"
                self.t_done = now

    def _token(self, now: int, tokens: int | None, chars: int, kind: int) -> None:
        """A token event of either kind: the decode window and the token count."""
        if self.t_first_token is None:
            self.t_first_token = now
        elif self.t_second_token is None:
            self.t_second_token = now
        self.t_last_token = now
        self.deltas += 1
        if tokens is None:
            self.tokens_known = False
        else:
            self.tokens += tokens
        if tokens != 0:
            self._burst(now, tokens or 1)
            self._stamp(now, tokens if tokens is not None else 0, chars, kind)

    def _burst(self, now: int, tokens: int) -> None:
        """Extend or end the run of token events closer together than any decode."""
        prev, self._prev_ns = self._prev_ns, now
        if prev is None:
            return
        if self._run and now - self._run_start < (self._run_tokens + tokens) * BURST_GAP_NS:
            self._run += 1
            self._run_tokens += tokens
        elif now - prev < tokens * BURST_GAP_NS:
            self._run, self._run_tokens, self._run_start = 1, tokens, prev
        else:
            self._run = 0
            return
        if self._run > self.burst_gaps:
            self.burst_gaps, self.burst_ns = self._run, now - self._run_start

    def _stamp(self, now: int, size: int, chars: int, kind: int) -> None:
        if self._skip:
            self._skip -= 1
            return
        times = self.times
        times.append(now - self.t_sent)
        self.sizes.append(size)
        self.lengths.append(chars)
        self.kinds.append(kind)
        if len(times) >= MAX_TIMES:
            # Keep every other time and sample half as often from now on. MAX_TIMES is
            # even, so the time just appended goes and the next one keeps the spacing.
            del times[1::2]
            del self.sizes[1::2]
            del self.lengths[1::2]
            del self.kinds[1::2]
            self.stride *= 2
            self._skip = 0
        else:
            self._skip = self.stride - 1

    def queue(self, now: int) -> None:
        """The request waits from `now` before it is sent (for a history summary): a
        phase of its own, not part of its TTFT."""
        self.t_queued = now

    def estimate_prompt(self, tokens: int, exact: bool) -> None:
        """Our own count of the prompt before sending (`exact`: the model's tokenizer),
        counted again when the prompt changed before it was sent."""
        self.prompt_estimate, self.prompt_estimate_exact = tokens, exact

    def cancel(self, now: int | None = None) -> None:
        """Mark a request the consumer abandoned (no terminal event arrived); one
        abandoned before it was sent (waiting for a summary) is sent and ended at once."""
        if not self.t_sent:
            self.t_sent = now or time.perf_counter_ns()
        if self.t_done is None:
            self.t_done = now or time.perf_counter_ns()
            self.finish = "cancelled"


async def record(stream: AsyncIterator[Event], trace: Trace) -> AsyncIterator[Event]:
    """Pass `stream` through, stamping each event into `trace` as it arrives."""
    clock = time.perf_counter_ns
    trace.t_sent = clock()
    try:
        async for event in stream:
            trace.observe(event, clock())
            yield event
    finally:
        trace.cancel()
        # Leaving `async for` early does not close the inner generator: close it here so
        # a cancelled generation stops its thread or its HTTP response now.
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
