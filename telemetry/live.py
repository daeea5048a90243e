"""A cheap snapshot of a running request, for a panel refreshed 10-20 times a second.

`compute()` sorts every gap for percentiles; this reads only counters and the last few
token times, so its cost does not grow with the answer's length. Each figure it shares
with the final metrics (TTFT, the load, the thinking, the decode and character rates)
comes from the same function (telemetry/figures.py): read at the request's end, the
panel and the footer agree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from phasechat.backends.events import PrefillProgress
from phasechat.telemetry import figures
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.recorder import Trace

#: "thinking" and "decode" (the answer) are both decode, told apart for thinking models;
#: "summary": not sent yet, waiting for a history summary; "loading": sent, waiting for
#: the model to load (in TTFT, not prefill).
Phase = Literal["summary", "loading", "waiting", "prefill", "thinking", "decode", "done"]
#: A gap this many times the running median is "slow"; longer than STUCK_S is "stuck".
SLOW_FACTOR = 4.0
STUCK_S = 2.0
RECENT = 48


@dataclass(frozen=True, slots=True)
class Live:
    """What the live panel shows."""

    phase: Phase
    elapsed_ms: float
    ttft_ms: float | None
    ttfo_ms: float | None  # first answer token (after the thinking, if any)
    reasoning_ms: float | None  # the thinking so far (still growing while it runs)
    reasoning_tokens: int  # thinking tokens (chunks where tokens are not known)
    prompt_tokens: int | None
    cached_tokens: int | None
    prefill_done: int | None  # prompt tokens done, cached included (engine-reported)
    prefill_left_ms: float | None  # the rest of the prefill at the engine's rate so far
    tokens: int
    #: "tokens" when the backend counts them; "chunks" when it cannot (a remote stream
    #: before its usage arrives): then `tokens` and the rate count chunks
    unit: Literal["tokens", "chunks"]
    tokens_estimated: bool
    decode_tok_s: float | None
    chars_per_s: float | None
    recent_itl_ms: tuple[float, ...]
    since_last_ms: float | None
    stall: Literal["", "slow", "stuck"]
    #: the local engine's thread count, when it is not simply all of them (else "")
    threads_note: str = ""
    #: the part of the TTFT spent waiting for the model to load (growing while it loads;
    #: None: no such wait)
    load_ms: float | None = None
    #: why `decode_tok_s` is unknown: the tokens came in a burst (`figures.decode_rate`)
    decode_unknown: str | None = None


def snapshot(trace: Trace, now_ns: int) -> Live:
    """The live view of `trace` at `now_ns` (a `perf_counter_ns` value)."""
    first, last = trace.t_first_token, trace.t_last_token
    if trace.t_queued is not None and not trace.t_sent:
        return _queued(trace, now_ns)
    if trace.done:
        phase: Phase = "done"
    elif trace.t_loading is not None and trace.t_loaded is None:
        phase = "loading"
    elif first is not None:
        thinking = trace.t_first_answer is None and trace.t_first_reasoning is not None
        phase = "thinking" if thinking else "decode"
    elif trace.t_first_byte is not None or trace.prompt is not None or trace.progress:
        phase = "prefill"
    else:
        phase = "waiting" if trace.prompt_estimate is None else "prefill"
    # the final metrics' count where someone counted; else chunks (a remote stream
    # before its usage) or none yet
    counted = figures.counted_tokens(trace)
    unit: Literal["tokens", "chunks"] = "tokens"
    if counted is not None:
        tokens, by_server = counted
    else:
        tokens, by_server = (trace.tokens if trace.tokens_known else trace.deltas), False
        unit = "tokens" if trace.tokens_known else "chunks"
    decode = figures.decode(trace, tokens, by_server)
    times = trace.times[-(RECENT + 1) :]
    stride = trace.stride
    recent = tuple((times[i] - times[i - 1]) / 1e6 / stride for i in range(1, len(times)))
    since = (now_ns - last) / 1e6 if last is not None and not trace.done else None
    stall: Literal["", "slow", "stuck"] = ""
    if since is not None:
        if since > STUCK_S * 1000:
            stall = "stuck"
        elif recent:
            median = sorted(recent)[len(recent) // 2]
            if median > 0 and since > SLOW_FACTOR * median and since > 100:
                stall = "slow"
    prompt = trace.prompt
    progress = trace.progress
    # A frame drawn between the turn's start and its send: nothing has been waited for yet
    # (t_sent is 0 until the request goes: "TTFT 8,504 s" was the clock since boot).
    elapsed = figures.elapsed_ms(trace, now_ns) if trace.t_sent else 0.0
    return Live(
        phase=phase,
        elapsed_ms=elapsed or 0.0,
        ttft_ms=figures.ttft_ms(trace),
        ttfo_ms=figures.ttfo_ms(trace),
        reasoning_ms=figures.reasoning_ms(trace, now_ns),
        reasoning_tokens=(
            trace.reasoning_tokens if trace.reasoning_tokens_known else trace.reasoning_deltas
        ),
        prompt_tokens=prompt.prompt_tokens if prompt else trace.prompt_estimate,
        cached_tokens=prompt.cached_tokens if prompt else (progress.cached if progress else None),
        prefill_done=progress.processed if progress else None,
        prefill_left_ms=_left(progress) if first is None else None,
        tokens=tokens,
        unit=unit,
        tokens_estimated=False,
        decode_tok_s=decode.tok_s,
        chars_per_s=figures.chars_per_s(trace, decode),
        recent_itl_ms=recent,
        since_last_ms=since,
        stall=stall,
        threads_note=threads_note(trace),
        load_ms=figures.load_ms(trace, now_ns),
        decode_unknown=decode.unknown,
    )


def threads_note(trace: Trace) -> str:
    """One line on the engine's threads when they changed this answer or run below the
    maximum ("threads 1 of 2 · 2 changes · at token 48: 1 thread 2.10x faster than 2")."""
    t = trace.threads
    if t is None or (t.threads == t.max_threads and not trace.thread_changes):
        return ""
    n = trace.thread_changes
    changes = f" · {n} change{'s' if n != 1 else ''}" if n else ""
    return f"threads {t.threads} of {t.max_threads}{changes} · at token {t.at_token}: {t.reason}"


def _left(progress: PrefillProgress | None) -> float | None:
    """The rest of the prefill at the rate the engine has shown so far."""
    if progress is None or progress.time_ms <= 0:
        return None
    done = progress.processed - progress.cached
    if done <= 0:
        return None
    return (progress.total - progress.processed) * progress.time_ms / done


def _queued(trace: Trace, now_ns: int) -> Live:
    """Not sent yet: the request waits for a history summary (not part of its TTFT)."""
    assert trace.t_queued is not None
    return Live(
        phase="summary",
        elapsed_ms=(now_ns - trace.t_queued) / 1e6,
        ttft_ms=None,
        ttfo_ms=None,
        reasoning_ms=None,
        reasoning_tokens=0,
        prompt_tokens=trace.prompt_estimate,
        cached_tokens=None,
        prefill_done=None,
        prefill_left_ms=None,
        tokens=0,
        unit="tokens",
        tokens_estimated=False,
        decode_tok_s=None,
        chars_per_s=None,
        recent_itl_ms=(),
        since_last_ms=None,
        stall="",
    )


def finished(live: Live, m: Metrics) -> Live:
    """The live view of a finished request, with the final figures: one number for one
    answer, the same as its footer (tokens from usage where the server sent it)."""
    return replace(
        live,
        phase="done",
        ttft_ms=m.ttft_ms,
        ttfo_ms=m.ttfo_ms,
        reasoning_ms=m.reasoning_ms,
        reasoning_tokens=m.reasoning_tokens or 0,
        tokens=m.output_tokens,
        unit="tokens",
        tokens_estimated=m.output_tokens_estimated,
        decode_tok_s=m.decode_tok_s,
        chars_per_s=m.chars_per_s,
        since_last_ms=None,
        stall="",
        load_ms=m.load_ms,
        decode_unknown=m.decode_unknown,
    )
