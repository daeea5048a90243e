"""Metric math on synthetic traces whose answers are known."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from phasechat.backends.events import (
    EngineThreads,
    Finished,
    FinishReason,
    KVStats,
    PromptEvaluated,
    ReasoningDelta,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.backends.tokens import estimate_text
from phasechat.telemetry.forecast import Rates, fit_line, forecast, measured_rates
from phasechat.telemetry.live import snapshot
from phasechat.telemetry.metrics import Metrics, compute, metrics_from_dict, percentile
from phasechat.telemetry.recorder import MAX_TIMES, Trace
from tests.near import near

MS = 1_000_000


def local_trace(n_tokens: int = 11, ttft_ms: int = 200, gap_ms: int = 10) -> Trace:
    """Prompt of 100 tokens (40 cached), first token at ttft_ms, then one every gap_ms."""
    t = Trace("local", "m")
    t.observe(PromptEvaluated(100, 40, 60), 5 * MS)
    for i in range(n_tokens):
        t.observe(TextDelta("ab", 1), (ttft_ms + i * gap_ms) * MS)
    t.observe(KVStats(111, 2048, 1000, 20000), (ttft_ms + (n_tokens - 1) * gap_ms) * MS)
    t.observe(Finished("stop"), (ttft_ms + (n_tokens - 1) * gap_ms + 5) * MS)
    return t


def test_known_answers() -> None:
    m = compute(local_trace())
    assert m.ttft_ms == 200
    assert m.e2e_ms == 305
    assert m.output_tokens == 11 and not m.output_tokens_estimated
    # decode window: 10 gaps of 10 ms for 10 tokens after the first
    assert m.decode_tok_s == pytest.approx(100.0)
    assert m.tpot_ms == pytest.approx(10.0)
    assert m.itl_ms_p50 == m.itl_ms_p99 == m.itl_ms_max == pytest.approx(10.0)
    # prefill rate over evaluated tokens only (60, not 100), over TTFT
    assert m.prefill_tok_s == pytest.approx(300.0)
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_prompt_tokens) == (100, 40, 60)
    # the character rates use the decode window too: the first token's 2 chars are out
    assert m.chars == 22 and m.chars_per_token == 2.0
    assert m.chars_per_s == pytest.approx(200.0)
    assert m.decode_tok_s is not None
    assert m.chars_per_s == pytest.approx(m.chars_per_token * m.decode_tok_s)
    assert m.prefill_share == pytest.approx(200 / 305)
    assert m.kv_used_tokens == 111 and m.kv_capacity_tokens == 2048


def test_decode_rate_is_not_tokens_over_wall_time() -> None:
    m = compute(local_trace(ttft_ms=5000))
    assert m.decode_tok_s == pytest.approx(100.0)  # a long prefill does not dilute it
    assert m.output_tokens / (m.e2e_ms or 1) * 1000 < 3


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == pytest.approx(80.8)
    assert percentile(values, 100) == 100.0


def test_itl_percentiles_with_one_outlier() -> None:
    t = Trace("local", "m")
    times = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 590]  # one 500 ms gap among 10 ms gaps
    for ms in times:
        t.observe(TextDelta("x", 1), ms * MS)
    t.observe(Finished("stop"), 600 * MS)
    m = compute(t)
    assert m.itl_ms_p50 == pytest.approx(10.0)
    assert m.itl_ms_max == pytest.approx(500.0)
    # numpy's linear percentile of the ten gaps: 10 + 0.91 x 490 = 455.9
    assert m.itl_ms_p99 == pytest.approx(455.9)
    assert m.itl_ms_p95 == pytest.approx(10 + 0.55 * 490)


def test_remote_chunks_use_server_usage_not_chunk_count() -> None:
    t = Trace("remote", "m")
    for i in range(5):  # 5 chunks, but the server says 20 tokens
        t.observe(TextDelta("four tokens here."), (100 + i * 40) * MS)
    t.observe(Usage(30, 20, None), 300 * MS)
    t.observe(Finished("stop"), 301 * MS)
    m = compute(t)
    assert m.output_tokens == 20 and not m.output_tokens_estimated
    assert m.decode_tok_s == pytest.approx(19 / 0.160)
    assert m.prompt_tokens == 30 and m.prompt_tokens_source == "server"


def test_remote_without_usage_is_an_estimate() -> None:
    t = Trace("remote", "m", prompt_estimate=12)
    t.observe(TextDelta("Hello there, general Kenobi."), 100 * MS)
    t.observe(TextDelta(" You are a bold one."), 150 * MS)
    t.observe(Finished("stop"), 151 * MS)
    m = compute(t)
    # cl100k_base: Hello|there|,|general|Ken|obi|.|You|are|a|bold|one|. = 13 tokens
    assert m.output_tokens_estimated and m.output_tokens == 13
    assert m.prompt_tokens == 12 and m.prompt_tokens_source == "estimate"


def test_japanese_chars_per_second_counts_characters_not_bytes() -> None:
    t = Trace("local", "m")
    pieces = ["こんにちは", "、世界", "。"]
    for i, p in enumerate(pieces):
        t.observe(TextDelta(p, 1), (100 + i * 50) * MS)
    t.observe(Finished("stop"), 200 * MS)
    m = compute(t)
    assert m.chars == 9  # not 27 UTF-8 bytes
    # after the first token: "、世界" and "。" in 0.1 s, 2 tokens
    assert m.chars_per_s == pytest.approx(4 / 0.1)
    assert m.chars_per_token == pytest.approx(2.0)
    assert m.chars_per_token is not None and m.decode_tok_s is not None
    assert m.chars_per_s == pytest.approx(m.chars_per_token * m.decode_tok_s)


def test_truncated_prompt_warning_from_server_timings() -> None:
    t = Trace("remote", "m", prompt_estimate=500, prompt_estimate_exact=True)
    # the server's 50 ms prefill fits in the 60 ms TTFT seen here (longer: a contradiction)
    t.observe(TextDelta("x"), 60 * MS)
    t.observe(
        ServerTimings(prompt_n=100, prompt_ms=50, predicted_n=1, predicted_ms=1, cache_n=0), 61 * MS
    )
    t.observe(Usage(500, 1), 61 * MS)
    t.observe(Finished("stop"), 62 * MS)
    m = compute(t)
    assert any("truncated" in w for w in m.warnings)
    assert m.server_prefill_tok_s == pytest.approx(2000.0)


def test_error_ends_the_trace() -> None:
    t = Trace("remote", "m")
    t.observe(TextDelta("partial"), 10 * MS)
    t.observe(StreamError("connection", "connection lost after 1 chunks"), 20 * MS)
    m = compute(t)
    assert m.finish == "error" and m.e2e_ms == 20 and t.text == "partial"


def test_token_times_stay_bounded() -> None:
    t = Trace("local", "m")
    n = MAX_TIMES * 3
    for i in range(n):
        t.observe(TextDelta("", 1), i * 1000)
    assert len(t.times) < MAX_TIMES
    assert t.tokens == n
    # spacing is kept: a decimated gap still reads as 1 µs per token
    m = compute(t)
    assert m.itl_ms_p50 == pytest.approx(0.001)


def test_live_snapshot_phases_and_stall() -> None:
    t = Trace("local", "m", prompt_estimate=50)
    assert snapshot(t, 10 * MS).phase == "prefill"
    for i in range(10):
        t.observe(TextDelta("x", 1), (100 + i * 10) * MS)
    live = snapshot(t, 195 * MS)
    assert live.phase == "decode" and live.decode_tok_s == pytest.approx(100.0)
    assert live.stall == ""
    assert snapshot(t, 600 * MS).stall == "slow"
    assert snapshot(t, 3000 * MS).stall == "stuck"
    t.observe(Finished("stop"), 3000 * MS)
    assert snapshot(t, 4000 * MS).phase == "done"


def test_thinking_after_the_answer_began_has_a_positive_span() -> None:
    # a server that interleaves: answer at 100 ms, thinking from 150 to 190 ms
    t = Trace("remote", "m")
    t.observe(TextDelta("a"), 100 * MS)
    t.observe(ReasoningDelta("hm"), 150 * MS)
    t.observe(ReasoningDelta("hm"), 190 * MS)
    t.observe(Finished("stop"), 200 * MS)
    assert compute(t).reasoning_ms == pytest.approx(40.0)


def test_no_rate_is_negative_or_beyond_belief() -> None:
    t = Trace("remote", "m")
    t.observe(TextDelta("a"), 100 * MS)
    t.observe(TextDelta("b"), 110 * MS)
    # the wire lets these counts through (each within a window); the rates they imply
    # (16M tokens in a nanosecond by the server's clock, in 100 ms by ours) reach no view
    t.observe(ServerTimings(16_000_000, 0.000001, 2, 0.0), 120 * MS)
    t.observe(Finished("stop"), 130 * MS)
    m = compute(t)
    assert m.server_prefill_tok_s is None and m.server_decode_tok_s is None
    assert m.prefill_tok_s is None
    assert m.decode_tok_s == pytest.approx(100.0)  # 1 token in 10 ms: believable, kept


# -- known answers that tell neighbouring formulas apart ---------------------------------
# Each trace below is built so that a plausible slip (p90 for p95, the wrong window, a
# count off by one, cached tokens counted as evaluated) moves the figure by far more than
# 5%; the right figure is computed by hand or by numpy, never by the product's own code.


@pytest.mark.parametrize(
    "times",
    [
        [0, 7, 19, 22, 40, 41, 75, 83, 130, 133, 200],  # 10 gaps: an even count
        [0, 7, 19, 22, 40, 41, 75, 83, 130, 133, 200, 204],  # 11 gaps: an odd count
    ],
)
def test_itl_percentiles_of_distinct_gaps_are_numpys(times: list[int]) -> None:
    t = Trace("local", "m")
    t.observe(PromptEvaluated(10, 0, 10), 1 * MS)
    for ms in times:
        t.observe(TextDelta("x", 1), (100 + ms) * MS)
    t.observe(Finished("stop"), (101 + times[-1]) * MS)
    m = compute(t)
    gaps = np.diff(times).astype(float)
    assert m.itl_ms_p50 == pytest.approx(float(np.percentile(gaps, 50)))
    assert m.itl_ms_p95 == pytest.approx(float(np.percentile(gaps, 95)))
    assert m.itl_ms_p99 == pytest.approx(float(np.percentile(gaps, 99)))
    assert m.itl_ms_max == float(gaps.max())
    # the four figures differ here, so no one of them can stand in for another
    assert len({m.itl_ms_p50, m.itl_ms_p95, m.itl_ms_p99, m.itl_ms_max}) == 4
    assert m.decode_tok_s == pytest.approx((len(times) - 1) / (times[-1] / 1000))
    assert m.tpot_ms == pytest.approx(times[-1] / (len(times) - 1))


def thinking_trace() -> Trace:
    """5 thinking tokens 20 ms apart from 100 ms, then 5 answer tokens of 3 characters
    10 ms apart from 190 ms: the answer's window (40 ms) is not the decode window (130)."""
    t = Trace("local", "m")
    t.observe(PromptEvaluated(50, 0, 50), 1 * MS)
    for i in range(5):
        t.observe(ReasoningDelta("hmm ", 1), (100 + 20 * i) * MS)
    for i in range(5):
        t.observe(TextDelta("abc", 1), (190 + 10 * i) * MS)
    t.observe(Finished("stop"), 240 * MS)
    return t


def test_a_thinking_answer_has_its_character_rate_over_the_answer_alone() -> None:
    m = compute(thinking_trace())
    assert (m.output_tokens, m.reasoning_tokens, m.answer_tokens) == (10, 5, 5)
    assert m.reasoning_tokens_source == "tokenizer"
    assert (m.ttft_ms, m.ttfo_ms, m.reasoning_ms) == (100, 190, 90)
    assert m.decode_tok_s == pytest.approx(9 / 0.130)  # every token, thinking included
    # 4 answer events after the first, 12 characters, over 190 -> 230 ms
    assert m.chars == 15
    assert m.chars_per_s == pytest.approx(12 / 0.040)
    assert m.chars_per_token == pytest.approx(12 / 4)


def test_a_zero_token_event_moves_the_end_of_the_decode_window() -> None:
    # the local backend's tail (text held back until the stream ends) has no token of its
    # own: it ends the window, and adds no gap
    t = Trace("local", "m")
    for i in range(10):
        t.observe(TextDelta("ab", 1), (100 + 10 * i) * MS)
    t.observe(TextDelta("!", 0), 210 * MS)
    t.observe(Finished("stop"), 211 * MS)
    assert t.t_last_token == 210 * MS
    m = compute(t)
    assert m.output_tokens == 10
    assert m.decode_tok_s == pytest.approx(9 / 0.110)
    assert m.chars_per_s == pytest.approx(19 / 0.110)
    assert m.itl_ms_max == pytest.approx(10.0)  # the tail is no token: no 20 ms gap


def server_trace(
    timings: ServerTimings, usage: Usage | None, tokens: int = 10, **trace: object
) -> Trace:
    """A remote answer of `tokens` one-token chunks 10 ms apart from 100 ms."""
    t = Trace("remote", "m", **trace)  # type: ignore[arg-type]
    for i in range(tokens):
        t.observe(TextDelta("w ", 1), (100 + 10 * i) * MS)
    t.observe(timings, (100 + 10 * tokens) * MS)
    if usage is not None:
        t.observe(usage, (100 + 10 * tokens) * MS)
    t.observe(Finished("stop"), (101 + 10 * tokens) * MS)
    return t


def test_llama_server_timings_without_usage_count_the_cached_prompt() -> None:
    timings = ServerTimings(
        prompt_n=60, prompt_ms=30.0, predicted_n=10, predicted_ms=90.0, cache_n=40
    )
    m = compute(server_trace(timings, None))
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_prompt_tokens) == (100, 40, 60)
    assert m.prompt_tokens_source == "server"
    # the rates count what was evaluated, not what was reused from the cache
    assert m.server_prefill_tok_s == pytest.approx(60 / 0.030)
    assert m.prefill_tok_s == pytest.approx(60 / 0.100)
    assert m.server_decode_tok_s == pytest.approx(10 / 0.090)
    assert m.warnings == ()


def test_a_mostly_cached_prompt_is_not_called_truncated() -> None:
    timings = ServerTimings(
        prompt_n=10, prompt_ms=5.0, predicted_n=10, predicted_ms=90.0, cache_n=90
    )
    m = compute(server_trace(timings, Usage(100, 10)))
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_prompt_tokens) == (100, 90, 10)
    assert m.warnings == ()
    cut = ServerTimings(prompt_n=10, prompt_ms=5.0, predicted_n=10, predicted_ms=90.0, cache_n=80)
    (warning,) = compute(server_trace(cut, Usage(100, 10))).warnings
    assert warning.startswith("server evaluated + cached 90 of 100 prompt tokens")


@pytest.mark.parametrize(("predicted", "alarm"), [(8, True), (9, False), (11, False), (12, True)])
def test_the_generated_count_check_allows_one_token_either_way(predicted: int, alarm: bool) -> None:
    timings = ServerTimings(prompt_n=5, prompt_ms=5.0, predicted_n=predicted, predicted_ms=90.0)
    m = compute(server_trace(timings, Usage(5, 10)))
    expected = (f"server generated {predicted} tokens, 10 arrived",) if alarm else ()
    assert m.warnings == expected


def test_counted_tokens_are_preferred_over_the_servers_usage() -> None:
    timings = ServerTimings(prompt_n=5, prompt_ms=5.0, predicted_n=10, predicted_ms=90.0)
    m = compute(server_trace(timings, Usage(5, 12)))
    assert m.output_tokens == 10 and not m.output_tokens_estimated
    assert m.decode_tok_s == pytest.approx(9 / 0.090)


def remote_read(read: int, sent: int, window: int | None) -> tuple[str, ...]:
    t = Trace("remote", "m", prompt_estimate=sent, prompt_estimate_exact=True, window=window)
    t.observe(TextDelta("w", 1), 100 * MS)
    t.observe(Usage(read, 1), 101 * MS)
    t.observe(Finished("stop"), 102 * MS)
    return compute(t).warnings


def test_the_window_check_starts_above_the_window() -> None:
    # a prompt exactly the window's size fits: 900 read of 1,000 is a count difference
    assert remote_read(900, 1000, window=1000) == ()
    assert remote_read(900, 1001, window=1000)[0].startswith("the server's window is 1,000")
    # a server that read all we sent was not cut, whatever we thought its window was
    assert remote_read(1000, 1000, window=800) == ()
    # with no window known: cut below half of what we sent, a count difference above it
    assert remote_read(500, 1000, window=None) == ()
    assert "probably truncated" in remote_read(499, 1000, window=None)[0]


def test_a_sub_millisecond_ttft_still_has_its_share_of_the_time() -> None:
    t = Trace("local", "m")
    t.observe(TextDelta("a", 1), MS // 2)  # 0.5 ms: a fully cached prompt
    t.observe(TextDelta("b", 1), 5 * MS)
    t.observe(Finished("stop"), 10 * MS)
    m = compute(t)
    assert m.prefill_share == pytest.approx(0.05) and m.decode_share == pytest.approx(0.95)


def test_thinking_with_no_answer_spans_its_first_to_its_last_token() -> None:
    t = Trace("remote", "m")
    for ms in (100, 130, 190):
        t.observe(ReasoningDelta("hm ", 1), ms * MS)
    t.observe(Finished("length"), 200 * MS)  # cut before any answer
    assert compute(t).reasoning_ms == pytest.approx(90.0)


def test_a_forecast_decodes_all_but_the_first_token() -> None:
    # 10 ms fixed + 100 new tokens at 100 tok/s = 1,010 ms to the first token; the other
    # 10 of 11 tokens at 50 tok/s take 200 ms more (the first came with the prefill)
    f = forecast(Rates(100.0, 50.0, 3, overhead_ms=10.0), 130, 30, 11, False)
    assert (f.ttft_ms, f.total_ms) == (near(1010.0), near(1210.0))
    assert (f.new_tokens, f.overhead_ms, f.prefill_ms) == (100, 10.0, near(1000.0))


def remote_trace(visible: int, counted: int, reason: FinishReason, silent_ms: int | None) -> Trace:
    """A server's stream: `visible` text chunks 10 ms apart from 200 ms (a token each),
    usage saying `counted` tokens, and the finish reason's own chunk at `silent_ms`."""
    t = Trace("remote", "m")
    for i in range(visible):
        t.observe(TextDelta("ab"), (200 + 10 * i) * MS)
    t.observe(Usage(30, counted), 900 * MS)
    silent = silent_ms * MS if silent_ms is not None else None
    t.observe(Finished(reason, silent), 901 * MS)
    return t


def test_decode_window_ends_at_a_counted_token_sent_without_text() -> None:
    # vLLM's end-of-sequence token: 16 tokens counted, 15 with text (200..340 ms), the
    # finish chunk one 10 ms step later. 15 gaps over 150 ms = 100 tok/s; the window to
    # the last text (14 gaps' time, 140 ms) would say 15/0.14 = 107.1 (+7%).
    m = compute(remote_trace(15, 16, "stop", 350))
    assert m.output_tokens == 16
    assert m.decode_tok_s == pytest.approx(100.0)
    assert m.tpot_ms == pytest.approx(10.0)
    # the answer's character rate over the same window: 14 chunks' 28 chars after the
    # first, over 150 ms, and per token 28 / 15
    assert m.chars_per_s == pytest.approx(28 / 0.150)
    assert m.chars_per_token == pytest.approx(28 / 15)


def test_a_finish_chunk_that_stands_for_no_token_does_not_move_the_window() -> None:
    # every counted token had its text: the late finish chunk is not a decode step
    m = compute(remote_trace(16, 16, "stop", 600))
    assert m.decode_tok_s == pytest.approx(15 / 0.150)
    # our own count (no usage) is not the server's: nothing to extend either
    t = Trace("remote", "m")
    for i in range(16):
        t.observe(TextDelta("ab", 1), (200 + 10 * i) * MS)
    t.observe(Finished("stop", 600 * MS), 601 * MS)
    assert compute(t).decode_tok_s == pytest.approx(100.0)


def test_the_stream_end_the_backend_stamped_is_the_end() -> None:
    t = remote_trace(15, 16, "stop", 350)
    t2 = Trace("remote", "m")
    t2.observe(TextDelta("ab"), 200 * MS)
    t2.observe(Finished("stop", None, 420 * MS), 2000 * MS)  # a /metrics scrape between
    assert compute(t2).e2e_ms == 420
    assert compute(t).e2e_ms == 901


def _answer(decode: float) -> Metrics:
    return metrics_from_dict(
        {
            "backend": "b",
            "model": "m",
            "finish": "stop",
            "decode_tok_s": decode,
            "output_tokens": 50,
        }
    )


def test_forecast_decode_rate_is_the_median_of_the_newest_eight_answers() -> None:
    old = [10.0] * 4
    new = [40.0, 47.0, 41.0, 46.0, 42.0, 45.0, 43.0, 44.0]
    rates = measured_rates([_answer(v) for v in old + new], "b")
    assert rates.decode_tok_s == pytest.approx(statistics.median(new))  # 43.5
    assert rates.samples == 8


def test_a_prefill_line_with_a_negative_intercept_has_no_overhead() -> None:
    # (100, 50) and (200, 250): 2 ms a token, intercept -150 ms, clamped to 0
    assert fit_line([(100.0, 50.0), (200.0, 250.0)]) == (0.0, near(2.0))
    history = [
        metrics_from_dict(
            {
                "backend": "b",
                "model": "m",
                "finish": "stop",
                "evaluated_prompt_tokens": n,
                "ttft_ms": t,
            }
        )
        for n, t in ((100, 50.0), (200, 250.0))
    ]
    rates = measured_rates(history, "b")
    assert rates.overhead_ms == 0.0 and rates.prefill_tok_s == pytest.approx(500.0)
    # 100 new tokens at 2 ms each, no overhead
    assert forecast(rates, 300, 200, 1, False).ttft_ms == pytest.approx(200.0)


def _measured(backend: str = "b", finish: str = "stop", **figures: float) -> Metrics:
    return metrics_from_dict({"backend": backend, "model": "m", "finish": finish, **figures})


def test_forecast_rates_count_answers_from_their_minimum_sizes_on() -> None:
    history = [
        _measured(decode_tok_s=30.0, output_tokens=4),  # 4 tokens: enough for a rate
        _measured(decode_tok_s=10.0, output_tokens=3),  # 3: too few
        _measured(decode_tok_s=50.0, output_tokens=20),
        _measured("other", decode_tok_s=90.0, output_tokens=20),  # another backend's
        _measured(finish="error", decode_tok_s=70.0, output_tokens=20),  # a failed answer
        # one prompt size each, no TTFT: the prefill rate is the median of those that
        # evaluated 16 tokens or more
        _measured(prefill_tok_s=100.0, evaluated_prompt_tokens=16),
        _measured(prefill_tok_s=10.0, evaluated_prompt_tokens=15),
        _measured(prefill_tok_s=300.0, evaluated_prompt_tokens=40),
    ]
    rates = measured_rates(history, "b")
    assert rates.decode_tok_s == pytest.approx(40.0)  # median of 30 and 50
    assert rates.prefill_tok_s == pytest.approx(200.0)  # median of 100 and 300
    assert (rates.samples, rates.overhead_ms) == (6, 0.0)


@pytest.mark.parametrize(
    ("points", "line"),
    [
        # sizes 8 apart: sum of squares 32 = 16 a point, enough; 50 ms fixed + 2 ms a token
        ([(100.0, 250.0), (108.0, 266.0)], (50.0, 2.0)),
        ([(100.0, 250.0), (107.0, 264.0)], None),  # 7 apart: 24.5 < 32, the slope is noise
        # three at 100, one at 109: 60.75 < 16 x 4 points, noise too
        ([(100.0, 250.0), (100.0, 250.0), (100.0, 250.0), (109.0, 268.0)], None),
        # a fast prefill, 0.5 ms a token (2,000 tok/s), 50 ms fixed
        ([(100.0, 100.0), (300.0, 200.0)], (50.0, 0.5)),
        ([(100.0, 50.0), (200.0, 50.0)], None),  # TTFT not growing with the prompt
        ([(100.0, 50.0)], None),  # one size
    ],
)
def test_a_prefill_line_needs_prompt_sizes_apart_and_a_rising_ttft(
    points: list[tuple[float, float]], line: tuple[float, float] | None
) -> None:
    fitted = fit_line(points)
    assert fitted == (pytest.approx(line) if line is not None else None)


def test_a_forecast_of_a_cached_prompt_and_no_output_is_its_overhead_alone() -> None:
    # 30 cached of a 20-token prompt: no new tokens (not -10); 0 max tokens: no decode
    f = forecast(Rates(100.0, 50.0, 1, overhead_ms=10.0), 20, 30, 0, False)
    assert f.new_tokens == 0 and f.prefill_ms == 0.0
    assert (f.ttft_ms, f.total_ms, f.overhead_ms) == (10.0, 10.0, 10.0)


def test_an_answer_without_thinking_has_no_thinking_count() -> None:
    m = compute(local_trace())
    assert (m.reasoning_tokens, m.reasoning_tokens_source, m.answer_tokens) == (None, "none", 11)


def test_live_thinking_of_a_stream_that_does_not_count_tokens_is_its_chunks() -> None:
    t = Trace("remote", "m")
    for ms in (100, 130, 190):
        t.observe(ReasoningDelta("hm ", tokens=None), ms * MS)
    assert snapshot(t, 200 * MS).reasoning_tokens == 3


def test_a_thread_change_is_a_new_thread_count_after_the_first() -> None:
    t = Trace("local", "m")
    for threads in (4, 4, 4, 6):  # the start, the same twice, then a change
        t.observe(EngineThreads(threads, 8, "load"), 5 * MS)
    t.observe(TextDelta("a", 1), 10 * MS)
    t.observe(Finished("stop"), 20 * MS)
    m = compute(t)
    assert (t.thread_changes, m.thread_changes, m.threads) == (1, 1, 6)


def test_token_times_are_kept_from_the_send_and_halved_exactly_at_the_cap() -> None:
    t = Trace("local", "m")
    t.t_sent = 1000 * MS
    n = MAX_TIMES + 3
    for i in range(n):  # token i at 1 ms + i ms after the send; odd ones: two thinking tokens
        kind = ReasoningDelta if i % 2 else TextDelta
        t.observe(kind("ab" if i % 2 else "a", 1 + i % 2), t.t_sent + (1 + i) * MS)
    # at MAX_TIMES entries every other one goes (the odd ones), then every second token
    kept = [*range(0, MAX_TIMES, 2), MAX_TIMES, MAX_TIMES + 2]
    assert list(t.times) == [(1 + i) * MS for i in kept]
    assert list(t.sizes) == [1 + i % 2 for i in kept]
    assert list(t.lengths) == [1 + i % 2 for i in kept]
    assert list(t.kinds) == [i % 2 for i in kept] and t.stride == 2


def test_cancel_ends_only_a_running_request_at_the_time_given() -> None:
    running, finished = Trace("local", "m"), local_trace()
    running.observe(TextDelta("ab", 1), 200 * MS)  # a token, and no end yet
    running.cancel(900 * MS)
    finished.cancel(900 * MS)
    assert (running.t_done, running.finish) == (900 * MS, "cancelled")
    assert (finished.t_done, finished.finish) == (305 * MS, "stop")


def test_a_thinking_count_over_the_output_leaves_no_negative_answer_count() -> None:
    t = Trace("remote", "m")
    t.observe(TextDelta("ab"), 200 * MS)
    t.observe(TextDelta("cd"), 210 * MS)
    t.observe(Usage(30, 5, reasoning_tokens=8), 220 * MS)  # 8 of 5 tokens thinking
    t.observe(Finished("stop"), 221 * MS)
    m = compute(t)
    assert (m.output_tokens, m.reasoning_tokens, m.answer_tokens) == (5, 8, 0)


def test_two_tokens_have_a_tpot_and_a_character_rate_per_token() -> None:
    t = Trace("local", "m")
    t.observe(TextDelta("ab", 1), 200 * MS)
    t.observe(TextDelta("cdef", 1), 210 * MS)
    t.observe(Finished("stop"), 215 * MS)
    m = compute(t)
    assert (m.tpot_ms, m.chars_per_token) == (near(10.0), 4.0)


@pytest.mark.parametrize(("completion", "expected"), [(40, 10), (41, 10), (43, 11), (6, 2)])
def test_a_server_total_without_its_split_is_shared_by_the_texts_estimated_sizes(
    completion: int, expected: int
) -> None:
    """A server that counts the whole output but not its thinking (llama-server): the
    thinking's share of the estimated text, applied to the server's exact total. Here
    the thinking estimates at a third of the answer (4 : 12 tokens), so it is a quarter
    of the total, rounded: 40 -> 10, 41 -> 10.25 -> 10, 43 -> 10.75 -> 11, 6 -> 1.5 -> 2."""
    thinking, answer = " word" * 4, " word" * 12
    a, b = estimate_text(thinking), estimate_text(answer)
    assert b == 3 * a  # the premise: a share of exactly one quarter
    t = Trace("remote", "m", prompt_estimate=10)
    t.observe(ReasoningDelta(thinking), 100 * MS)
    t.observe(TextDelta(answer), 150 * MS)
    t.observe(Usage(10, completion), 160 * MS)
    t.observe(Finished("stop"), 170 * MS)
    m = compute(t)
    assert m.output_tokens == completion and not m.output_tokens_estimated
    assert (m.reasoning_tokens, m.reasoning_tokens_source) == (expected, "estimate")
    assert m.answer_tokens == completion - expected


@pytest.mark.parametrize(
    ("max_tokens", "warnings"),
    [
        (11, ()),  # stopped exactly at its limit: the engine kept its word
        (10, ("11 tokens exceed max_tokens 10",)),  # one over: the engine did not
        (0, ()),  # no limit asked
    ],
)
def test_an_answer_that_stopped_exactly_at_max_tokens_did_not_exceed_it(
    max_tokens: int, warnings: tuple[str, ...]
) -> None:
    t = Trace("local", "m", max_tokens=max_tokens)
    t.observe(PromptEvaluated(100, 40, 60), 5 * MS)
    for i in range(11):
        t.observe(TextDelta("ab", 1), (200 + 10 * i) * MS)
    t.observe(Finished("length"), 305 * MS)
    assert compute(t).warnings == warnings


# -- a burst is no decode rate (issue 47, item 9) ---------------------------------------
US = 1_000


def remote_answer(times_us: list[int]) -> Trace:
    """A remote answer of one chunk at each time (µs after the send), 20 tokens used."""
    t = Trace("openai", "m")
    for at in times_us:
        t.observe(TextDelta("ab"), at * US)
    t.observe(Usage(5, len(times_us)), times_us[-1] * US)
    t.observe(Finished("stop"), times_us[-1] * US)
    return t


def test_a_burst_after_a_pause_read_in_pieces_has_no_decode_rate() -> None:
    # the first chunk at 100 ms, then 299 handed on at 500 ms, parsed 20 µs each with a
    # 3 ms pause every 64 (new reads on a busy loop): a window of 17.9 ms, no decode
    times = [100_000] + [500_000 + i * 20 + (i // 64) * 3_000 for i in range(299)]
    m = compute(remote_answer(times))
    assert m.decode_tok_s is None and m.tpot_ms is None
    assert m.decode_unknown == (
        "299 of 300 token events arrived together within 17.96 ms: a burst (a proxy that "
        "buffers the stream?), no decode rate"
    )
    live = snapshot(remote_answer(times), times[-1] * US)
    assert live.decode_tok_s is None and live.decode_unknown == m.decode_unknown


def test_a_speculative_decoders_groups_keep_the_decode_rate() -> None:
    # 4 tokens of each step arrive together (10 µs apart), a step every 8 ms: 500 tok/s
    times = [step * 8_000 + k * 10 for step in range(50) for k in range(4)]
    m = compute(remote_answer(times))
    assert m.decode_unknown is None
    assert m.decode_tok_s == pytest.approx(199 / (times[-1] - times[0]) * 1e6)
    # ... and a window under 0.2 ms a token is a burst whatever its shape
    m = compute(remote_answer([0, 100, 200, 300, 700, 900]))
    assert m.decode_unknown is not None and m.decode_unknown.startswith(
        "6 tokens arrived within 0.90 ms, faster than any engine decodes"
    )
