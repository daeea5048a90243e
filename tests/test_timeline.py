"""An answer's own timeline (telemetry/timeline.py and its view): each token's gap ranked
among the answer's own, stalls over 4x the median, the handover from thinking to answer,
chunks of several tokens; the request's phases first; `t` on an answer opens it. An SVG
snapshot with fixed timings."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot

from phasechat.backends.events import (
    Finished,
    ReasoningDelta,
    ResponseStarted,
    ServerTimings,
    TextDelta,
)
from phasechat.chat.config.settings import Settings
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace
from phasechat.telemetry.timeline import STALL_X, quantile_bounds, timeline_of
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.timeline_view import TimelineView
from phasechat.tui.widgets.chat_widgets import MessageView
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend

MS = 1_000_000


def fixed_trace() -> Trace:
    """A remote answer: headers at 300 ms (connect 2.5 ms), two thinking chunks, then the
    answer; gaps 10, 12, 14, ... ms, one stall of 200 ms, one chunk of three tokens."""
    t = Trace("server", "remote-model")
    t.t_sent = 0
    t.observe(ResponseStarted(200, connect_ms=2.5), 300 * MS)
    at = 340
    t.observe(ReasoningDelta("Let", tokens=None), at * MS)
    at += 10
    t.observe(ReasoningDelta(" think", tokens=None), at * MS)
    words = ["The", " tower", " has", " a", " lamp", " that", " turns", " all", " night."]
    for i, word in enumerate(words):
        at += 200 if i == 5 else 12 + 2 * i
        t.observe(TextDelta(word + (" and a lens" if i == 3 else ""), tokens=None), at * MS)
    t.observe(
        ServerTimings(prompt_n=40, prompt_ms=250.0, predicted_n=12, predicted_ms=400.0), at * MS
    )
    t.observe(Finished("stop"), at * MS)
    return t


def test_each_gap_is_ranked_among_the_answers_own() -> None:
    trace = fixed_trace()
    line = timeline_of(trace)
    gaps = [round(t.gap_ms) for t in line.ticks]
    assert gaps == [340, 10, 12, 14, 16, 18, 20, 200, 24, 26, 28]
    assert [t.text for t in line.ticks][-9:] == [
        "The",
        " tower",
        " has",
        " a and a lens",
        " lamp",
        " that",
        " turns",
        " all",
        " night.",
    ]
    assert [t.thinking for t in line.ticks] == [True, True] + [False] * 9
    # the median of the 10 inner gaps is 19 ms: only the 200 ms gap is over 4x it
    assert line.median_ms == 19 and STALL_X == 4
    assert [t.stall for t in line.ticks].count(True) == 1 and line.ticks[7].stall
    # a chunk of several tokens: " a and a lens" (4 by the estimate), the others one each
    assert [t.tokens for t in line.ticks] == [1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 2]
    assert line.ticks[1].shade == 0 and line.ticks[7].shade == 4  # shortest, longest
    assert line.tokens_estimated  # a remote stream does not say its tokens


def test_quantile_bounds_are_the_gaps_at_each_fifth() -> None:
    assert quantile_bounds([float(x) for x in range(1, 11)]) == (2.0, 4.0, 6.0, 8.0, 10.0)
    assert quantile_bounds([5.0]) == (5.0,) * 5
    assert quantile_bounds([]) == ()


def test_the_timeline_view_with_fixed_timings(snap_compare: Any) -> None:
    trace = fixed_trace()
    view = TimelineView(
        timeline_of(trace), compute(trace), "the timeline of answer 1 · server", True
    )

    async def show(pilot: Pilot[None]) -> None:
        await pilot.app.push_screen(view)
        await pilot.pause()

    app = PhasechatApp(settings=Settings(), backend=ScriptedBackend())
    assert snap_compare(app, terminal_size=(110, 24), run_before=show)


async def test_t_on_an_answer_opens_its_timeline() -> None:
    app = PhasechatApp(settings=Settings(), backend=ScriptedBackend(text="one two three"))
    async with app.run_test(size=(110, 30)) as pilot:
        app.chat.send("hello")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        await pilot.press("ctrl+up")  # the answer
        assert isinstance(app.focused, MessageView) and app.focused.message.role == "assistant"
        await pilot.press("t")
        await pilot.pause()
        assert isinstance(app.screen, TimelineView)
        assert "first token" in str(app.screen.query_one("#head").render())
        await pilot.press("escape")
        await pilot.press("up")  # the question: no timeline offered there
        question = pilot.app.focused  # (mypy still takes app.focused for the answer)
        assert isinstance(question, MessageView) and question.message.role == "user"
        await pilot.press("t")
        await pilot.pause()
        assert not isinstance(app.screen, TimelineView)


def test_quantile_bounds_of_two_gaps_start_at_the_shortest() -> None:
    # nearest rank round(k * 2 / 5), at least the first: ranks 1, 1, 1, 2, 2
    assert quantile_bounds([3.0, 1.0]) == (1.0, 1.0, 1.0, 3.0, 3.0)


def test_a_gap_of_exactly_four_medians_is_not_a_stall_and_the_first_tick_is_the_ttft() -> None:
    trace = Trace("local", "m")
    at = 5  # a TTFT shorter than every inner gap: its shade is still the TTFT's own (the top)
    trace.observe(TextDelta("a", tokens=1, t_ns=at * MS), at * MS)
    for gap in (10, 41, 10, 40, 10):  # median 10 ms: 40 is 4x it (no stall), 41 is over
        at += gap
        trace.observe(TextDelta("b", tokens=1, t_ns=at * MS), at * MS)
    line = timeline_of(trace)
    assert [t.gap_ms for t in line.ticks] == [5.0, 10.0, 41.0, 10.0, 40.0, 10.0]
    assert [t.stall for t in line.ticks] == [False, False, True, False, False, False]
    assert [t.shade for t in line.ticks] == [4, 0, 4, 0, 3, 0]
    assert line.bounds == (10.0, 10.0, 10.0, 40.0, 41.0)


def test_a_sampled_trace_spreads_each_gap_over_its_stride() -> None:
    trace = Trace("local", "m")
    trace.times.extend([20 * MS, 26 * MS, 30 * MS])  # every other token kept
    trace.sizes.extend([0, 0, 0])
    trace.lengths.extend([3, 3, 3])
    trace.kinds.extend([0, 0, 0])
    trace.stride = 2
    line = timeline_of(trace)
    assert [t.gap_ms for t in line.ticks] == [20.0, 12.0, 8.0]
    assert not line.whole and [t.text for t in line.ticks] == ["", "", ""]
    assert [t.tokens for t in line.ticks] == [1, 1, 1]  # no text to estimate: one each
