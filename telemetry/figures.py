"""One formula per figure of a request, for the live panel and the final metrics alike.

Each figure the panel and the answer's footer both show (TTFT, the wait for the model,
the thinking's span, the decode rate and its window, the character rate, the prefill
rate) is worked out from a `Trace` in one function here, called by `telemetry/live.py`
while the request runs and by `telemetry/metrics.py` at its end, so the two agree by
construction.

`now_ns` is the clock for a request still running (a figure that grows while its phase
lasts grows to it); None reads the trace as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from phasechat.backends.remote.wire_numbers import as_rate
from phasechat.telemetry.recorder import BURST_GAP_NS, Trace

_NS_PER_MS = 1_000_000


def since_sent_ms(trace: Trace, t: int | None) -> float | None:
    """Milliseconds from the send to `t` (ns), None without `t`."""
    return (t - trace.t_sent) / _NS_PER_MS if t is not None else None


def ttft_ms(trace: Trace) -> float | None:
    """The send to the first token of any kind (thinking or answer)."""
    return since_sent_ms(trace, trace.t_first_token)


def ttfo_ms(trace: Trace) -> float | None:
    """The send to the first answer token (after the thinking, if any)."""
    return since_sent_ms(trace, trace.t_first_answer)


def elapsed_ms(trace: Trace, now_ns: int | None) -> float | None:
    """The send to the request's end (to `now_ns` while it runs; never negative)."""
    end = trace.t_done if trace.t_done is not None else now_ns
    return max(0.0, (end - trace.t_sent) / _NS_PER_MS) if end is not None else None


def load_ms(trace: Trace, now_ns: int | None) -> float | None:
    """The part of the TTFT spent waiting for the model to load: to the load's end, or
    to `now_ns` while it lasts; None when the request did not wait or the load never
    ended. A load that ended as the request was sent is a wait of 0, and the wait is
    never longer than the TTFT it is part of."""
    if trace.t_loading is None:
        return None
    ready = trace.t_loaded
    if ready is None:
        if trace.done or now_ns is None:
            return None
        ready = now_ns
    waited = max(0.0, (ready - trace.t_sent) / _NS_PER_MS)
    ttft = ttft_ms(trace)
    return min(waited, ttft) if ttft is not None else waited


def reasoning_ms(trace: Trace, now_ns: int | None) -> float | None:
    """The thinking's span: its first token to the first answer token; to `now_ns`
    while it still thinks; else to its last token. Thinking that goes on after the
    answer began (a server that interleaves them) ends at its last token: the span is
    never negative."""
    first, answered = trace.t_first_reasoning, trace.t_first_answer
    if first is None:
        return None
    end: int | None = trace.t_last_reasoning
    if answered is not None and answered > first:
        end = answered
    elif answered is None and not trace.done and now_ns is not None:
        end = now_ns
    return (end - first) / _NS_PER_MS if end is not None else None


def counted_tokens(trace: Trace) -> tuple[int, bool] | None:
    """Every generated token (thinking included) as counted, best source first: the
    backend's own count, the server's usage, the server's timings; and whether the
    server counted them. None where nobody counted (a stream of chunks before its usage)."""
    if trace.tokens_known and trace.deltas:
        return trace.tokens, False
    if trace.usage is not None and trace.usage.completion_tokens:
        return trace.usage.completion_tokens, True
    if trace.server is not None and trace.server.predicted_n:
        return trace.server.predicted_n, True
    return None


@dataclass(frozen=True, slots=True)
class Decode:
    """The decode of `tokens` (or chunks): its window's end (ns), its rate, the time per
    token after the first, and why the rate is unknown when it is (None: it is not)."""

    last: int | None
    tok_s: float | None
    tpot_ms: float | None
    unknown: str | None


def decode(trace: Trace, tokens: int, counted_by_server: bool) -> Decode:
    """The decode window and rate of `tokens` generated: (tokens - 1) / (last token -
    first token), the first token excluded. The window ends where the count ends: a
    token the server counted without sending text for it (the end-of-sequence token)
    came with its silent chunk, one decode step after the last text."""
    first, last = trace.t_first_token, trace.t_last_token
    silent = trace.t_silent_token
    beyond = counted_by_server and tokens > trace.deltas  # a token without text
    if beyond and silent is not None and last is not None and silent > last:
        last = silent
    tok_s, unknown = decode_rate(trace, tokens, first, last)
    window = window_s(first, last)
    tpot = window * 1000 / (tokens - 1) if tok_s and window and tokens > 1 else None
    return Decode(last, tok_s, tpot, unknown)


def decode_rate(
    trace: Trace, tokens: int, first: int | None, last: int | None
) -> tuple[float | None, str | None]:
    """The decode rate of `tokens` (or chunks) from `first` to `last` (ns), and why it
    is unknown when it is (None: it is not).

    A burst is no decode rate: tokens that came closer together than any engine
    decodes them (BURST_GAP_NS per token) were decoded earlier and handed on at once.
    Either the whole window is shorter than that floor for its tokens, or one run of
    events that came that fast, together, holds most of them (a proxy that held back
    most of the answer; the few tokens of a speculative step that arrive together are
    not most of an answer, and the step's own gap ends their run).
    Cheap: the run is counted by the recorder as the tokens arrive."""
    gaps = tokens - 1
    if first is None or last is None or gaps < 1:
        return None, None
    window = last - first
    if window < gaps * BURST_GAP_NS:
        return None, (
            f"{tokens:,} tokens arrived within {window / _NS_PER_MS:,.2f} ms, faster than "
            "any engine decodes: a burst (a proxy that buffers the stream?), no decode rate"
        )
    if trace.burst_gaps * 2 > trace.deltas - 1:
        return None, (
            f"{trace.burst_gaps + 1:,} of {trace.deltas:,} token events arrived together "
            f"within {trace.burst_ns / _NS_PER_MS:,.2f} ms: a burst (a proxy that buffers "
            "the stream?), no decode rate"
        )
    return rate(gaps, window / 1e9), None


def chars_per_s(trace: Trace, d: Decode) -> float | None:
    """The answer's characters a second over its own decode window (first answer event
    -> the decode window's end; the first event's characters excluded); unknown where
    the decode rate is a burst's."""
    answer_s = window_s(trace.t_first_answer, d.last)
    chars = trace.chars - trace.chars_first
    return chars / answer_s if answer_s and d.unknown is None else None


def ready_ms(ttft: float | None, load: float | None) -> float | None:
    """The TTFT less the wait for the model: the request's own wait, prefill's time."""
    return ttft - load if ttft is not None and load is not None else ttft


def prefill_rate(evaluated: int | None, ttft: float | None, load: float | None) -> float | None:
    """Prompt tokens actually evaluated over the TTFT less the wait for the model."""
    ready = ready_ms(ttft, load)
    return rate(evaluated, ready / 1000 if ready else None)


def window_s(first: int | None, last: int | None) -> float | None:
    """Seconds from `first` to `last` (ns), None when not a positive span."""
    if first is None or last is None or last <= first:
        return None
    return (last - first) / 1e9


def rate(n: int | None, seconds: float | None) -> float | None:
    """`n` tokens over `seconds` a second: None unless both are positive and the rate is
    believable (never negative, never astronomically large)."""
    if not n or n < 0 or not seconds or seconds <= 0:
        return None
    return as_rate(n / seconds)
