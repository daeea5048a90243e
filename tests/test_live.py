"""The live panel's snapshot of a running request (telemetry/live.py), every field known
by hand, on gaps chosen so that a neighbouring statistic (the mean of the recent gaps
for their median, the lower middle for the upper) gives another verdict."""

from __future__ import annotations

import pytest

from phasechat.backends.events import (
    EngineThreads,
    Finished,
    ModelLoaded,
    ModelLoading,
    PrefillProgress,
    PromptEvaluated,
    ReasoningDelta,
    ResponseStarted,
    TextDelta,
)
from phasechat.telemetry.live import RECENT, Live, finished, snapshot, threads_note
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace
from tests.near import near

MS = 1_000_000


def tokens_at(times_ms: list[int], sent_ms: int = 10) -> Trace:
    """A local answer: a 100-token prompt (40 cached), one 2-character token at each time."""
    t = Trace("local", "m", prompt_estimate=50)
    t.t_sent = sent_ms * MS
    t.observe(PromptEvaluated(100, 40, 60), 20 * MS)
    for ms in times_ms:
        t.observe(TextDelta("ab", 1), ms * MS)
    return t


def test_every_field_of_a_decoding_snapshot_that_one_slow_gap_does_not_make_slow() -> None:
    # nine 10 ms gaps, then one of 1,000 ms: median 10, mean 109. 210 ms since the last
    # token is slow by the median (> 4 x 10 and > 100 ms); by the mean it would not be
    # (4 x 109 = 436)
    times = [100 + 10 * i for i in range(10)] + [1190]
    live = snapshot(tokens_at(times), 1400 * MS)
    assert live == Live(
        phase="decode",
        elapsed_ms=1390.0,
        ttft_ms=90.0,
        ttfo_ms=90.0,
        reasoning_ms=None,
        reasoning_tokens=0,
        prompt_tokens=100,
        cached_tokens=40,
        prefill_done=None,
        prefill_left_ms=None,
        tokens=11,
        unit="tokens",
        tokens_estimated=False,
        decode_tok_s=near(10 / 1.090),
        chars_per_s=near(20 / 1.090),  # the first token's 2 characters are out
        recent_itl_ms=(10.0,) * 9 + (1000.0,),
        since_last_ms=210.0,
        stall="slow",
        threads_note="",
        load_ms=None,
    )


def test_a_gap_slow_by_the_mean_of_the_recent_gaps_is_not_slow_by_their_median() -> None:
    # four 1 ms gaps and five of 100 ms: median 100, mean 56. 300 ms is slow by the mean
    # (> 224) but not by the median (< 400)
    times = [100, 101, 102, 103, 104, 204, 304, 404, 504, 604]
    live = snapshot(tokens_at(times), 904 * MS)
    assert live.recent_itl_ms == (1.0,) * 4 + (100.0,) * 5
    assert (live.since_last_ms, live.stall) == (300.0, "")


def test_the_median_of_an_even_count_of_gaps_is_the_upper_middle_one() -> None:
    # gaps 10, 10, 30, 30: the upper middle (30) says 110 ms is not slow (< 120); the
    # lower middle (10) or the mean of the two (20) would call it slow
    live = snapshot(tokens_at([100, 110, 120, 150, 180]), 290 * MS)
    assert (live.since_last_ms, live.stall) == (110.0, "")
    assert snapshot(tokens_at([100, 110, 120, 150, 180]), 301 * MS).stall == "slow"


@pytest.mark.parametrize(
    ("since_ms", "stall"),
    [
        (100, ""),  # 10 x the median, but not over 100 ms
        (101, "slow"),
        (2000, "slow"),  # stuck only past STUCK_S
        (2001, "stuck"),
    ],
)
def test_slow_starts_past_100_ms_and_stuck_past_two_seconds(since_ms: int, stall: str) -> None:
    times = [100 + 10 * i for i in range(11)]
    assert snapshot(tokens_at(times), (200 + since_ms) * MS).stall == stall


def test_only_the_recent_gaps_are_shown_and_judged() -> None:
    # 60 gaps: the first 12 of 500 ms fall out of the last RECENT (48), all of 10 ms
    times = [100 + 500 * i for i in range(13)]
    times += [times[-1] + 10 * i for i in range(1, 49)]
    live = snapshot(tokens_at(times), (times[-1] + 150) * MS)
    assert live.recent_itl_ms == (10.0,) * RECENT
    assert live.stall == "slow"  # by the recent median (10), not the old 500 ms gaps
    assert live.decode_tok_s == pytest.approx(60 / (times[-1] - times[0]) * 1000)


def test_every_field_of_a_thinking_snapshot_after_a_load_and_a_prefill_progress() -> None:
    t = Trace("local", "m", prompt_estimate=50)
    t.t_sent = 10 * MS
    t.observe(ModelLoading(), 10 * MS)
    t.observe(ModelLoaded(t_ns=30 * MS), 31 * MS)
    t.observe(PrefillProgress(total=200, cached=50, processed=110, time_ms=30.0), 60 * MS)
    t.observe(EngineThreads(2, 4, "slower with 4", 8), 61 * MS)
    t.observe(ReasoningDelta("hm", 1), 100 * MS)
    t.observe(ReasoningDelta("m", 2), 120 * MS)
    live = snapshot(t, 150 * MS)
    assert live == Live(
        phase="thinking",
        elapsed_ms=140.0,
        ttft_ms=90.0,
        ttfo_ms=None,
        reasoning_ms=50.0,  # to now, while it thinks
        reasoning_tokens=3,
        prompt_tokens=50,  # our estimate: the engine has not said
        cached_tokens=50,  # the progress's
        prefill_done=110,
        prefill_left_ms=None,  # the first token came: no prefill left
        tokens=3,
        unit="tokens",
        tokens_estimated=False,
        decode_tok_s=near(2 / 0.020),
        chars_per_s=None,
        recent_itl_ms=(20.0,),
        since_last_ms=30.0,
        stall="",
        threads_note="threads 2 of 4 · at token 8: slower with 4",
        load_ms=20.0,
    )


def test_the_prefill_left_is_the_rest_at_the_rate_shown_so_far() -> None:
    t = Trace("local", "m")
    t.t_sent = 10 * MS
    # 60 of the 150 uncached tokens read in 30 ms (2 a ms): 90 left take 45 ms
    t.observe(PrefillProgress(total=200, cached=50, processed=110, time_ms=30.0), 60 * MS)
    live = snapshot(t, 70 * MS)
    assert (live.phase, live.prefill_done, live.cached_tokens) == ("prefill", 110, 50)
    assert live.prefill_left_ms == pytest.approx(45.0)
    assert (live.elapsed_ms, live.ttft_ms, live.since_last_ms) == (60.0, None, None)


def test_a_finished_snapshot_takes_the_answers_final_figures() -> None:
    t = tokens_at([100 + 10 * i for i in range(11)])
    live = snapshot(t, 260 * MS)
    assert (live.since_last_ms, live.stall) == (60.0, "")
    t.observe(Finished("stop"), 300 * MS)
    done = finished(live, compute(t))
    assert (done.phase, done.ttft_ms, done.ttfo_ms, done.tokens, done.unit) == (
        "done",
        90.0,
        90.0,
        11,
        "tokens",
    )
    assert done.decode_tok_s == pytest.approx(100.0) and done.chars_per_s == pytest.approx(200.0)
    assert (done.since_last_ms, done.stall, done.reasoning_tokens, done.load_ms) == (
        None,
        "",
        0,
        None,
    )
    # the live figures it has no final value for are kept
    assert (done.elapsed_ms, done.prompt_tokens, done.cached_tokens) == (250.0, 100, 40)
    after = snapshot(t, 400 * MS)
    assert (after.phase, after.elapsed_ms, after.since_last_ms) == ("done", 290.0, None)


def test_the_phases_before_the_first_token() -> None:
    t = Trace("remote", "m")
    t.t_queued = 5 * MS  # waiting for a history summary, not sent yet
    queued = snapshot(t, 35 * MS)
    assert (queued.phase, queued.elapsed_ms, queued.ttft_ms, queued.tokens) == (
        "summary",
        30.0,
        None,
        0,
    )
    t.t_sent = 40 * MS
    assert snapshot(t, 50 * MS).phase == "waiting"  # sent, nothing back, no estimate
    t.observe(ModelLoading(), 41 * MS)
    loading = snapshot(t, 90 * MS)
    assert (loading.phase, loading.load_ms, loading.elapsed_ms) == ("loading", 50.0, 50.0)
    t.observe(ModelLoaded(), 100 * MS)
    ready = snapshot(t, 120 * MS)
    assert (ready.phase, ready.load_ms) == ("waiting", 60.0)  # the load's end, not now
    t.observe(ResponseStarted(200), 130 * MS)
    assert snapshot(t, 140 * MS).phase == "prefill"
    # a frame drawn before the send: nothing waited for yet (not the clock since boot)
    fresh = Trace("local", "m", prompt_estimate=12)
    drawn = snapshot(fresh, 8_504_000 * MS)
    assert (drawn.phase, drawn.elapsed_ms, drawn.prompt_tokens) == ("prefill", 0.0, 12)


def test_the_threads_note_counts_its_changes() -> None:
    t = Trace("local", "m")
    t.observe(EngineThreads(4, 4, "start"), 1 * MS)
    assert threads_note(t) == ""  # all of them, unchanged: nothing to say
    t.observe(EngineThreads(2, 4, "slower", 10), 2 * MS)
    assert threads_note(t) == "threads 2 of 4 · 1 change · at token 10: slower"
    t.observe(EngineThreads(4, 4, "probe", 20), 3 * MS)
    assert threads_note(t) == "threads 4 of 4 · 2 changes · at token 20: probe"
