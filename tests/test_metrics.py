"""Metric math on synthetic traces whose answers are known."""

from __future__ import annotations

import pytest

from phasechat.backends.events import (
    Finished,
    KVStats,
    PromptEvaluated,
    ReasoningDelta,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.telemetry.live import snapshot
from phasechat.telemetry.metrics import compute, percentile
from phasechat.telemetry.recorder import MAX_TIMES, Trace

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
    assert m.itl_ms_p99 is not None and 400 < m.itl_ms_p99 <= 500


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
    assert m.output_tokens_estimated and m.output_tokens >= 8
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
    assert m.chars_per_s == pytest.approx(m.chars_per_token * (m.decode_tok_s or 0))


def test_truncated_prompt_warning_from_server_timings() -> None:
    t = Trace("remote", "m", prompt_estimate=500, prompt_estimate_exact=True)
    t.observe(TextDelta("x"), 10 * MS)
    t.observe(
        ServerTimings(prompt_n=100, prompt_ms=50, predicted_n=1, predicted_ms=1, cache_n=0), 11 * MS
    )
    t.observe(Usage(500, 1), 11 * MS)
    t.observe(Finished("stop"), 12 * MS)
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
