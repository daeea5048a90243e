"""One formula per figure (issue 50): a trace read live at its end (telemetry/live.py's
`snapshot`, without `finished`) gives the figures its final metrics give
(telemetry/metrics.py's `compute`), since both take each figure from one function
(telemetry/figures.py). Each trace is picked so that the two old formulas gave two
figures: thinking that went on after the answer began, a load that never ended or
that the clocks put after the first token, a token the server counted without text."""

from __future__ import annotations

import pytest

from phasechat.backends.events import (
    Finished,
    ModelLoaded,
    ModelLoading,
    PromptEvaluated,
    ReasoningDelta,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.telemetry.live import snapshot
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace

MS = 1_000_000


def figures_live_and_final(trace: Trace) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """The figures the panel and the footer both show, read live at the trace's end and
    as its final metrics."""
    assert trace.t_done is not None
    live, m = snapshot(trace, trace.t_done), compute(trace)
    return (
        (live.ttft_ms, live.ttfo_ms, live.reasoning_ms, live.load_ms, live.elapsed_ms),
        (m.ttft_ms, m.ttfo_ms, m.reasoning_ms, m.load_ms, m.e2e_ms),
    )


def sent_at(ms: int, backend: str = "local") -> Trace:
    t = Trace(backend, "m")
    t.t_sent = ms * MS
    return t


def test_thinking_that_goes_on_after_the_answer_began_is_one_span() -> None:
    # a server that interleaves: an answer token at 100, thinking from 120 to 180
    t = sent_at(10, "remote")
    t.observe(TextDelta("a", 1), 100 * MS)
    t.observe(ReasoningDelta("hm", 1), 120 * MS)
    t.observe(ReasoningDelta("m", 1), 180 * MS)
    t.observe(TextDelta("b", 1), 200 * MS)
    t.observe(Finished("stop"), 210 * MS)
    live, final = figures_live_and_final(t)
    assert final == (90.0, 90.0, 60.0, None, 200.0)  # first to last thinking token
    assert live == final  # the old live formula: first answer - first thinking, -20 ms


def test_a_load_that_never_ended_is_no_load_time() -> None:
    t = sent_at(10)
    t.observe(ModelLoading(), 10 * MS)
    t.observe(StreamError("model", "the model file is not a model"), 400 * MS)
    live, final = figures_live_and_final(t)
    assert final == (None, None, None, None, 390.0)
    assert live == final  # the old live formula: the load lasted to the error, 390 ms


def test_a_load_is_never_longer_than_the_ttft_it_is_part_of() -> None:
    # the load's end stamped after the first token (another thread's clock)
    t = sent_at(10)
    t.observe(ModelLoading(), 10 * MS)
    t.observe(PromptEvaluated(20, 0, 20), 50 * MS)
    t.observe(TextDelta("a", 1), 60 * MS)
    t.observe(ModelLoaded(t_ns=70 * MS), 71 * MS)
    t.observe(TextDelta("b", 1), 80 * MS)
    t.observe(Finished("stop"), 90 * MS)
    live, final = figures_live_and_final(t)
    assert final == (50.0, 50.0, None, 50.0, 80.0)
    assert live == final  # the old live formula: 60 ms of load in a 50 ms TTFT


def test_the_decode_window_ends_where_the_server_s_count_ends() -> None:
    # 4 chunks of text, the usage counts 5 tokens: the fifth (end of sequence) came with
    # the silent chunk at 160, one step after the last text at 130
    t = sent_at(10, "remote")
    for i in range(4):
        t.observe(TextDelta("ab"), (100 + 10 * i) * MS)
    t.observe(Usage(12, 5, 0), 160 * MS)
    t.observe(Finished("stop", t_silent_ns=160 * MS), 161 * MS)
    live, m = snapshot(t, 161 * MS), compute(t)
    assert m.output_tokens == 5 and m.decode_tok_s == pytest.approx(4 / 0.060)
    assert m.chars_per_s == pytest.approx(6 / 0.060)  # the first chunk's 2 out
    # read live once the count arrived: the same tokens over the same window
    assert (live.tokens, live.unit) == (5, "tokens")
    assert (live.decode_tok_s, live.chars_per_s) == (m.decode_tok_s, m.chars_per_s)


def test_read_mid_stream_the_panel_and_the_running_metrics_agree() -> None:
    # the compare view draws compute(trace, now) beside the panel's snapshot: while the
    # model loads, then while it thinks, both read one figure
    t = sent_at(10)
    t.observe(ModelLoading(), 10 * MS)
    loading = (snapshot(t, 70 * MS), compute(t, 70 * MS))
    assert loading[0].load_ms == loading[1].load_ms == 60.0  # to now while it lasts
    assert loading[0].elapsed_ms == loading[1].e2e_ms == 60.0
    t.observe(ModelLoaded(t_ns=80 * MS), 81 * MS)
    t.observe(PromptEvaluated(20, 0, 20), 90 * MS)
    assert compute(t, 95 * MS).prefill_tok_s is None  # read, but no token yet: no TTFT
    for ms in (100, 110, 130):
        t.observe(ReasoningDelta("hm", 1), ms * MS)
    live, m = snapshot(t, 150 * MS), compute(t, 150 * MS)
    assert (live.phase, live.tokens, m.output_tokens) == ("thinking", 3, 3)
    assert live.reasoning_ms == m.reasoning_ms == 50.0  # to now while it thinks
    assert live.load_ms == m.load_ms == 70.0  # to the load's end, now it ended
    assert live.decode_tok_s == m.decode_tok_s == pytest.approx(2 / 0.030)
    assert (live.ttft_ms, live.ttfo_ms, live.elapsed_ms) == (m.ttft_ms, None, m.e2e_ms)
    assert m.ttft_ms == 90.0 and m.e2e_ms == 140.0
    # 20 prompt tokens in the 20 ms after the load (over the whole TTFT: 222 tok/s)
    assert m.prefill_tok_s == pytest.approx(1000.0)
    t.observe(TextDelta("ok", 1), 160 * MS)
    live, m = snapshot(t, 170 * MS), compute(t, 170 * MS)
    assert live.reasoning_ms == m.reasoning_ms == 60.0  # to the answer's first token
    assert live.ttfo_ms == m.ttfo_ms == 150.0


def test_an_end_stamped_before_the_send_is_no_negative_time() -> None:
    t = sent_at(50)
    t.observe(Finished("stop", t_ns=40 * MS), 60 * MS)  # another thread's clock
    assert snapshot(t, 70 * MS).elapsed_ms == compute(t).e2e_ms == 0.0


def test_the_server_s_timings_count_stretches_the_window_as_its_usage_does() -> None:
    # llama-server: 4 chunks of text, its timings count 5 tokens, the fifth with the
    # silent chunk at 160
    t = sent_at(10, "remote")
    for i in range(4):
        t.observe(TextDelta("ab"), (100 + 10 * i) * MS)
    t.observe(ServerTimings(12, 5.0, 5, 50.0), 160 * MS)
    t.observe(Finished("stop", t_silent_ns=160 * MS), 161 * MS)
    live, m = snapshot(t, 161 * MS), compute(t)
    assert (live.tokens, m.output_tokens) == (5, 5)
    assert live.decode_tok_s == m.decode_tok_s == pytest.approx(4 / 0.060)


def test_the_backend_s_own_count_is_not_stretched_to_a_silent_chunk() -> None:
    # the local engine counts its own tokens (2 an event): every one came with its text
    t = sent_at(10)
    for i in range(3):
        t.observe(TextDelta("ab", 2), (100 + 10 * i) * MS)
    t.observe(Finished("stop", t_silent_ns=200 * MS), 201 * MS)
    live, m = snapshot(t, 201 * MS), compute(t)
    assert (live.tokens, m.output_tokens) == (6, 6)
    assert live.decode_tok_s == m.decode_tok_s == pytest.approx(5 / 0.020)


def test_thinking_and_answer_stamped_together_span_to_the_last_thinking_token() -> None:
    # one chunk that carried the first thinking and the first answer text at once
    t = sent_at(10, "remote")
    t.observe(ReasoningDelta("hm", 1), 100 * MS)
    t.observe(TextDelta("a", 1), 100 * MS)
    t.observe(ReasoningDelta("m", 1), 140 * MS)
    t.observe(Finished("stop"), 150 * MS)
    live, final = figures_live_and_final(t)
    assert live[2] == final[2] == 40.0
