"""A server's own account, held against the request as measured here (issue 38, item 4):
scripted /metrics pages whose counters move forward but claim what the request rules
out, counters that run backwards, duplicate lines that sum to infinity, and a server's
prefill longer than the TTFT seen here. Impossible figures are unknown, with one line
each, never shown as fact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    ResponseStarted,
    ServerAccount,
    ServerTimings,
    TextDelta,
    Usage,
)
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.server_metrics import CROWDED, Span, account, joined, parse, span_of
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record
from phasechat.telemetry.verdict import engine_says

#: the counters before the request: 3 finished, nothing running
BEFORE = {
    "vllm:e2e_request_latency_seconds_count": 3.0,
    "vllm:prompt_tokens_total": 100.0,
    "vllm:generation_tokens_total": 50.0,
    "vllm:request_prefill_time_seconds_sum": 1.0,
    "vllm:request_decode_time_seconds_sum": 2.0,
    "vllm:request_queue_time_seconds_sum": 0.5,
    "vllm:time_to_first_token_seconds_sum": 1.5,
}


def page(values: dict[str, float], extra: str = "") -> str:
    lines = ["vllm:num_requests_running 0", "vllm:num_requests_waiting 0"]
    lines += [f"{name} {value!r}" for name, value in values.items()]
    return "\n".join(lines) + "\n" + extra


def after(**deltas: float) -> dict[str, float]:
    """BEFORE moved on by one request: `prompt`, `generated` tokens, `prefill`,
    `decode`, `queue`, `ttft` seconds (names short for the metric's)."""
    names = {
        "prompt": "vllm:prompt_tokens_total",
        "generated": "vllm:generation_tokens_total",
        "prefill": "vllm:request_prefill_time_seconds_sum",
        "decode": "vllm:request_decode_time_seconds_sum",
        "queue": "vllm:request_queue_time_seconds_sum",
        "ttft": "vllm:time_to_first_token_seconds_sum",
    }
    out = dict(BEFORE)
    out["vllm:e2e_request_latency_seconds_count"] += 1
    for short, d in deltas.items():
        out[names[short]] += d
    return out


def acct(later: dict[str, float], usage: Usage | None, span: Span) -> ServerAccount:
    b, a = parse(page(BEFORE)), parse(page(later))
    assert a is not None
    return account(b, a, usage, span)


def test_a_queue_and_prefill_of_a_day_in_a_73_ms_request_are_unknown() -> None:
    later = after(prompt=16, generated=5, prefill=86_000, queue=86_000, decode=0.040, ttft=0.03)
    a = acct(later, Usage(16, 5), Span(73.0, 16, 5))
    assert a.unknown is None  # the request was alone: its other figures stand
    assert (a.queue_ms, a.prefill_ms) == (None, None)
    assert a.decode_ms == pytest.approx(40.0)
    assert a.ttft_ms == pytest.approx(30.0)
    assert a.prompt_tokens == 16 and a.generated_tokens == 5
    (line,) = a.doubts
    assert "86,000,000 ms of queue" in line and "86,000,000 ms of prefill" in line
    assert "73 ms measured here: not believed" in line


def test_phases_that_fit_one_by_one_but_not_together_are_unknown() -> None:
    # 30 + 30 + 30 = 90 ms of a 73 ms request: each fits, the three do not
    a = acct(after(prefill=0.03, queue=0.03, decode=0.03), None, Span(73.0, 4000, 100))
    assert (a.queue_ms, a.prefill_ms, a.decode_ms) == (None, None, None)
    (line,) = a.doubts
    assert "90 ms of queue + prefill + decode" in line
    # 20 + 20 + 30 = 70 ms: they fit, and are kept
    ok = acct(after(prefill=0.02, queue=0.02, decode=0.03), None, Span(73.0, 4000, 100))
    assert ok.doubts == ()
    assert ok.queue_ms == pytest.approx(20.0) and ok.decode_ms == pytest.approx(30.0)


def test_without_usage_the_prompt_is_bounded_by_its_own_bytes() -> None:
    messages = (Message("user", "hi"),)
    span = span_of(73.0, messages, 100, None)
    # 2 bytes + the template's allowance: far below 16,000,000, far above a real count
    assert span.prompt_tokens == 2 + 256 + 4096 and span.output_tokens == 100
    a = acct(after(prompt=16_000_000, generated=5, prefill=0.0017), None, span)
    assert a.prompt_tokens is None and a.cached_tokens is None
    assert a.prefill_ms == pytest.approx(1.7) and a.generated_tokens == 5
    (line,) = a.doubts
    assert line.startswith("vLLM /metrics: 16,000,000 prompt tokens for a prompt of at most")
    # usage, where it says, is the bound itself
    assert span_of(73.0, messages, 100, Usage(16, 5)) == Span(73.0, 16, 5)


def test_more_generated_than_max_tokens_is_unknown() -> None:
    a = acct(after(prompt=16, generated=5000), None, Span(73.0, 4000, 100))
    assert a.generated_tokens is None and a.prompt_tokens == 16
    assert a.doubts == (
        "vLLM /metrics: 5,000 tokens generated for an answer of at most 100: not believed",
    )


def test_counters_that_run_backwards_are_a_restart_with_no_account() -> None:
    later = after(prompt=16)
    later["vllm:generation_tokens_total"] = 0.0  # 50 before: counting again from zero
    later["vllm:e2e_request_latency_seconds_count"] = 1.0
    a = acct(later, Usage(16, 500), Span(73.0, 16, 500))
    assert a.unknown is not None and "restarted" in a.unknown
    assert "-" not in a.unknown  # not "generated -50 tokens", nor "-2 requests finished"
    assert (a.prompt_tokens, a.generated_tokens, a.prefill_ms) == (None, None, None)
    assert a.pool_tokens is None  # the page had no pool: nothing invented


def test_duplicate_lines_that_sum_to_infinity_are_unknown_not_nan() -> None:
    dup = (
        'vllm:generation_tokens_total{engine="1"} 1e308\n'
        'vllm:generation_tokens_total{engine="2"} 1e308\n'
    )
    values = {k: v for k, v in BEFORE.items() if k != "vllm:generation_tokens_total"}
    scrape = parse(page(values, dup))
    assert scrape is not None and scrape.get("generated") is None
    assert scrape.broken == (("generated", float("inf")),)
    a = account(scrape, scrape, Usage(16, 5), Span(73.0, 16, 5))
    assert a.unknown == "the server's generated tokens are no number (its lines sum to inf)"
    assert "nan" not in a.unknown


def test_one_line_of_1e308_is_still_a_number() -> None:
    # the neighbour of the case above: one such line sums to itself, which is finite
    scrape = parse(page(BEFORE, "vllm:prompt_tokens_cached_total 1e308\n"))
    assert scrape is not None and scrape.broken == () and scrape.get("cached") == 1e308


# -- through the backend, as `ask` and the UI see it ----------------------------------


def scripted(pages: list[str], sse: str) -> RemoteBackend:
    reads: Iterator[str] = iter(pages)
    models = (Path(__file__).parent / "fixtures" / "vllm" / "models.json").read_text()

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            return httpx.Response(200, content=models)
        if path.endswith("/metrics"):
            return httpx.Response(200, text=next(reads, pages[-1]))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async def body() -> AsyncIterator[bytes]:
        for event in sse.split("\n\n"):
            yield (event + "\n\n").encode()
            await asyncio.sleep(0.001)

    config = RemoteConfig(base_url="http://vllm.test/v1", model="smollm2")
    return RemoteBackend(config, transport=httpx.MockTransport(handler))


def chunk(content: str, finish: str | None = None) -> str:
    reason = f'"{finish}"' if finish else "null"
    delta = f'{{"content":"{content}"}}'
    return f'data: {{"choices":[{{"index":0,"delta":{delta},"finish_reason":{reason}}}]}}'


#: an answer of 4 chunks and no usage (a server that sends none)
NO_USAGE = "\n\n".join(
    [chunk("a"), chunk("b"), chunk("c"), chunk("d"), chunk("", "stop"), "data: [DONE]"]
)


async def answer(pages: list[str]) -> tuple[list[Event], Trace]:
    backend = scripted(pages, NO_USAGE)
    await backend.start()
    trace = Trace("openai", "smollm2")
    request = GenerationRequest((Message("user", "a 16-token prompt"),), max_tokens=100)
    events = [e async for e in record(backend.stream(request), trace)]
    await backend.aclose()
    return events, trace


async def test_a_16_million_token_prompt_is_not_printed_as_a_prefill_rate() -> None:
    later = after(prompt=16_000_000, generated=4, prefill=1.7, decode=0.02, queue=86_000)
    events, trace = await answer([page(BEFORE), page(later)])
    (a,) = [e for e in events if isinstance(e, ServerAccount)]
    assert a.unknown is None and a.prompt_tokens is None and a.queue_ms is None
    m = compute(trace)
    said = engine_says(m)
    assert "9,411,764" not in said and "16000000" not in said and "queue" not in said
    assert m.server_prefill_tok_s is None and m.server_queue_ms is None
    # each figure not believed is named among the warnings, the request's own e2e with it
    assert any("16,000,000 prompt tokens for a prompt of at most" in w for w in m.warnings)
    assert any("86,000,000 ms of queue" in w and "measured here" in w for w in m.warnings)


async def test_a_restart_between_the_reads_gives_a_one_line_unknown() -> None:
    later = after(prompt=16)
    later["vllm:generation_tokens_total"] = 0.0
    _, trace = await answer([page(BEFORE), page(later)])
    said = engine_says(compute(trace))
    assert "restarted" in said and "-50" not in said and "tok/s" not in said


# -- a server's prefill against the TTFT measured here --------------------------------

MS = 1_000_000  # ns


def trace_with(timings: ServerTimings, ttft_ms: float, e2e_ms: float) -> Trace:
    trace = Trace("openai", "m")
    t0 = trace.t_sent = 10_000 * MS
    trace.observe(ResponseStarted(200), t0 + MS)
    trace.observe(TextDelta("a"), t0 + round(ttft_ms * MS))
    trace.observe(TextDelta("b"), t0 + round(e2e_ms * MS) - MS)
    trace.observe(Usage(16, 2), t0 + round(e2e_ms * MS))
    trace.observe(timings, t0 + round(e2e_ms * MS))
    trace.observe(Finished("stop"), t0 + round(e2e_ms * MS))
    return trace


def test_a_server_prefill_longer_than_our_ttft_is_named_as_a_contradiction() -> None:
    m = compute(trace_with(ServerTimings(16, 10.0, 2, 20.0), ttft_ms=5.0, e2e_ms=50.0))
    (line,) = [w for w in m.warnings if w.startswith("contradiction")]
    assert "10.0 ms to its first token" in line and "5.0 ms TTFT measured here" in line
    # within the clocks' slack (4 ms of a 5 ms TTFT): agreement, nothing said
    ok = compute(trace_with(ServerTimings(16, 4.0, 2, 20.0), ttft_ms=5.0, e2e_ms=50.0))
    assert not any(w.startswith("contradiction") for w in ok.warnings)
    assert ok.server_prompt_ms == 4.0


def test_server_timings_longer_than_the_whole_request_are_unknown() -> None:
    m = compute(trace_with(ServerTimings(16, 30.0, 2, 40.0), ttft_ms=35.0, e2e_ms=50.0))
    assert m.server_prompt_ms is None and m.server_prefill_tok_s is None
    assert m.server_decode_tok_s is None
    assert any("prefill + decode (70.0 ms)" in w and "50.0 ms" in w for w in m.warnings)
    ok = compute(trace_with(ServerTimings(16, 30.0, 2, 15.0), ttft_ms=35.0, e2e_ms=50.0))
    assert ok.server_prompt_ms == 30.0 and ok.server_predicted_ms == 15.0


def test_a_prefill_time_without_its_count_says_so_and_not_none() -> None:
    # the /metrics prompt count not believed, its time kept: "-", never "None tok"
    later = after(prompt=16_000_000, generated=4, prefill=0.0017)
    a = acct(later, None, Span(73.0, 4000, 100))
    trace = trace_with(ServerTimings(None, None, None, None), ttft_ms=5.0, e2e_ms=50.0)
    trace.server = None  # the account alone speaks for the server
    trace.account = a
    said = engine_says(compute(trace))
    assert said.startswith("vLLM /metrics says prefill - tok/s (- tok)") and "None" not in said


# -- usage and timings, held against the prompt sent ----------------------------------


def usage_chunk(prompt_tokens: int, timings: bool = False) -> str:
    extra = (
        f',"timings":{{"prompt_n":{prompt_tokens},"prompt_ms":1.0,'
        '"predicted_n":2,"predicted_ms":2.0,"cache_n":0}'
        if timings
        else ""
    )
    usage = f'"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":2}}'
    return f'data: {{"choices":[],{usage}{extra}}}'


async def stream_of(sse: str) -> Trace:
    backend = scripted([page(BEFORE)], sse)
    await backend.start()
    trace = Trace("openai", "smollm2")
    request = GenerationRequest((Message("user", "a 16-token prompt"),), max_tokens=100)
    _ = [e async for e in record(backend.stream(request), trace)]
    await backend.aclose()
    return trace


@pytest.mark.parametrize("timings", [False, True])
async def test_a_usage_of_16_million_prompt_tokens_for_17_bytes_is_not_believed(
    timings: bool,
) -> None:
    sse = [chunk("a"), chunk("b", "stop"), usage_chunk(16_000_000, timings), "data: [DONE]"]
    trace = await stream_of("\n\n".join(sse))
    assert trace.usage is not None and trace.usage.prompt_tokens is None
    assert trace.usage.completion_tokens == 2  # the rest of usage stands
    if timings:
        assert trace.server is not None and trace.server.prompt_n is None
    m = compute(trace)
    assert m.prompt_tokens != 16_000_000 and m.server_prompt_n is None
    # 17 bytes + one message's allowance + the template's: 4,369
    lines = [w for w in m.warnings if "from http://vllm.test/v1" in w]
    assert lines[0] == (
        "ignored usage.prompt_tokens (16,000,000) from http://vllm.test/v1: more than the "
        "prompt sent can be (at most 4,369 tokens)"
    )
    assert len(lines) == (2 if timings else 1)


async def test_a_usage_within_the_prompt_is_kept() -> None:
    sse = [chunk("a"), chunk("b", "stop"), usage_chunk(4_369, True), "data: [DONE]"]
    trace = await stream_of("\n\n".join(sse))
    assert trace.usage is not None and trace.usage.prompt_tokens == 4_369
    assert trace.server is not None and trace.server.prompt_n == 4_369
    assert not trace.doubts


# Issue 49: a request's own per-request figures (vLLM's `metrics`, llama-server's
# `timings`) are held against the request as /metrics' are, and kept when /metrics'
# are not this request's alone.
def test_a_request_s_own_queue_counts_among_its_phases() -> None:
    span = Span(1000.0, 4000, 100)
    # vLLM's per-request metrics: 600 + 300 + 300 ms in 1,000 ms; each fits alone
    own = ServerAccount("vLLM per-request metrics", queue_ms=600, prefill_ms=300, decode_ms=300)
    a = joined(own, None, span)
    assert a is not None and (a.queue_ms, a.prefill_ms, a.decode_ms) == (None, None, None)
    (line,) = a.doubts
    assert "1,200 ms of queue + prefill + decode" in line
    # 400 + 300 + 300: they fit together, at the bound
    fits = ServerAccount("vLLM per-request metrics", queue_ms=400, prefill_ms=300, decode_ms=300)
    kept = joined(fits, None, span)
    assert kept is not None and kept.doubts == ()
    assert (kept.queue_ms, kept.prefill_ms, kept.decode_ms) == (400, 300, 300)
    # the queue alone longer than the request
    long = joined(ServerAccount("vLLM per-request metrics", queue_ms=1_100), None, span)
    assert long is not None and long.queue_ms is None and len(long.doubts) == 1


def test_llama_server_s_two_phases_longer_than_the_request_are_not_believed() -> None:
    span = Span(1000.0, 4000, 100)
    own = ServerAccount("llama-server timings", prefill_ms=800, decode_ms=700)
    a = joined(own, None, span)
    assert a is not None and (a.prefill_ms, a.decode_ms) == (None, None)
    (line,) = a.doubts
    assert "1,500 ms of prefill + decode" in line and "1,000 ms measured here" in line
    ok = joined(ServerAccount("llama-server timings", prefill_ms=300, decode_ms=700), None, span)
    assert ok is not None and (ok.prefill_ms, ok.decode_ms) == (300, 700) and ok.doubts == ()


def test_a_request_s_own_figures_stand_when_others_ran_beside_it() -> None:
    span = Span(1000.0, 4000, 100)
    crowded = ServerAccount("vLLM /metrics", pool_tokens=9_000, unknown=CROWDED)
    own = ServerAccount("vLLM per-request metrics", queue_ms=10, prefill_ms=200, decode_ms=300)
    a = joined(own, crowded, span)
    assert a is not None and a.unknown is None
    assert (a.queue_ms, a.prefill_ms, a.decode_ms) == (10, 200, 300)
    assert a.pool_tokens == 9_000 and a.source == "vLLM per-request metrics + vLLM /metrics"
    # nothing of its own: /metrics' reason stands
    bare = joined(ServerAccount("vLLM per-request metrics"), crowded, span)
    assert bare is not None and bare.unknown == CROWDED
    assert joined(None, crowded, span) is crowded
