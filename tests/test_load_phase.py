"""The first answer, sent while the model loads: the wait for the model is a phase of its
own. TTFT stays the user's wait from the send to the first token; the load is kept apart
(`load_ms`, the footer's second line, the panel's headline) and never called prefill (its
rate, the verdict). The model file is named from the start, before it is loaded."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    ModelLoaded,
    ModelLoading,
    PromptEvaluated,
    TextDelta,
)
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import SMOLLM2_FILE
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.live import snapshot
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace
from phasechat.telemetry.verdict import phase_shares, stats_line, verdict
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import LivePanel, MessageView
from phasechat.tui.widgets.telemetry_view import answer_footer, live_lines
from phasechat.tui.widgets.verdict_view import VerdictLine
from phasechat.tui.widgets.welcome import Welcome
from tests.helpers import settled, wait_for

MS = 1_000_000


def loaded_trace() -> Trace:
    """Sent at 0; waited for the model until 900 ms; 50 prompt tokens read, the first
    token at 1,000 ms, the fifth (last) at 1,200 ms."""
    trace = Trace(backend="local", model="m")
    trace.t_sent = 0
    trace.observe(ModelLoading(), 1 * MS)
    trace.observe(ModelLoaded(t_ns=900 * MS), 950 * MS)  # stamped where the load ended
    trace.observe(PromptEvaluated(50, 0, 50), 901 * MS)
    for i in range(5):
        trace.observe(TextDelta("x", tokens=1, t_ns=(1000 + 50 * i) * MS), 1300 * MS)
    trace.observe(Finished("stop", t_ns=1200 * MS), 1300 * MS)
    return trace


def test_the_wait_for_the_model_is_kept_apart_from_prefill() -> None:
    m = compute(loaded_trace(), 1300 * MS)
    assert m.ttft_ms == pytest.approx(1000)  # the user's wait, the load in it
    assert m.load_ms == pytest.approx(900)  # to when the load ended, not to the event
    assert m.ttft_ready_ms == pytest.approx(100)
    # 50 tokens in the 100 ms after the model was ready (over the whole TTFT: 50 tok/s)
    assert m.prefill_tok_s == pytest.approx(500)
    assert m.as_dict()["load_ms"] == pytest.approx(900)  # `ask --json` and the exports
    shares = dict(phase_shares(m) or ())
    # of 1,200 ms: load 900, prefill 100, decode 200 (the whole TTFT would be prefill 83%)
    assert shares == pytest.approx({"load": 0.75, "decode": 200 / 1200, "prefill": 100 / 1200})
    judged = verdict(m)
    assert judged is not None and judged.phase == "load"
    assert judged.line().startswith("load-bound (load 75% · decode 17% · prefill 8%): the model")
    assert "prefill-bound" not in judged.line() and "try a stable prefix" not in judged.line()
    assert stats_line(m).startswith("ttft 1,000 ms (load 900 ms) · ")
    footer = answer_footer(m).plain.splitlines()
    assert footer[0].startswith("TTFT 1,000 ms · ")
    assert footer[1] == (
        "load 900 ms: this answer waited for the model to load "
        "(TTFT 1,000 ms = load 900 ms + prefill 100 ms)"
    )


def test_a_load_that_ended_as_the_request_was_sent_is_a_wait_of_zero() -> None:
    trace = Trace(backend="local", model="m")
    trace.t_sent = 10 * MS
    trace.observe(ModelLoading(), 10 * MS)
    trace.observe(ModelLoaded(t_ns=9 * MS), 11 * MS)  # the load's thread got there first
    trace.observe(TextDelta("x", tokens=1, t_ns=60 * MS), 61 * MS)
    m = compute(trace, 70 * MS)
    assert m.load_ms == 0.0 and m.ttft_ms == pytest.approx(50) and m.ttft_ready_ms == m.ttft_ms


def test_while_the_model_loads_the_panel_says_so_not_prefilling() -> None:
    trace = Trace(backend="local", model="m", prompt_estimate=24)
    trace.t_sent = 1  # sent at the clock's start (a t_sent of 0 is "not sent yet")
    trace.observe(ModelLoading(), 1 * MS)
    live = snapshot(trace, 45_707 * MS)
    assert live.phase == "loading" and live.load_ms == pytest.approx(45_707)
    head = live_lines(live)[0].content.plain
    assert head.startswith("loading the model   TTFT 45.71 s…"), head
    assert "prefill" in head and "prefilling" not in head  # "in TTFT, not prefill"
    # once loaded, the prefill says how much of the TTFT so far was the load
    trace.observe(ModelLoaded(t_ns=45_500 * MS), 45_501 * MS)
    live = snapshot(trace, 45_600 * MS)
    assert live.phase == "prefill"
    assert "prefilling 24 tokens   TTFT 45.60 s… (load 45.5 s)" in live_lines(live)[0].content.plain


@pytest.mark.model
async def test_the_first_answer_sent_while_loading_has_load_ms_and_no_prefill_verdict() -> None:
    backend = LocalBackend(LocalConfig(n_ctx=2048))  # the bundled model, found by default
    assert backend.model == SMOLLM2_FILE  # named before it is loaded
    turns = TurnController(backend, Settings(system="Be brief.", max_tokens=4, temperature=0))
    loading = asyncio.ensure_future(backend.start())
    await asyncio.sleep(0)
    try:
        assert backend.state == "loading"
        exchange = turns.begin("Hi.")
        kinds: list[type[Event]] = []
        async for event in turns.run(exchange):
            kinds.append(type(event))
        await loading
        m = exchange.metrics
        assert m is not None and m.finish in ("stop", "length"), exchange.answer.error
        # the wait, then the model's own events: nothing was read before it was loaded
        assert kinds[:2] == [ModelLoading, ModelLoaded] and PromptEvaluated in kinds
        assert exchange.answer.model == SMOLLM2_FILE
        assert m.load_ms is not None and m.ttft_ms is not None and m.e2e_ms is not None
        assert 0 < m.load_ms < m.ttft_ms
        evaluated = m.evaluated_prompt_tokens
        assert evaluated and m.prefill_tok_s == pytest.approx(
            evaluated / ((m.ttft_ms - m.load_ms) / 1000)
        )
        shares = dict(phase_shares(m) or ())
        assert shares["load"] == pytest.approx(m.load_ms / m.e2e_ms)
        assert shares["prefill"] == pytest.approx((m.ttft_ms - m.load_ms) / m.e2e_ms)
        # a short question's prefill is a fraction of a load (weights, warm-up)
        judged = verdict(m)
        assert judged is not None and judged.phase == "load", judged
        assert "prefill-bound" not in judged.line()
    finally:
        await backend.aclose()


@pytest.mark.model
async def test_the_ui_names_the_model_from_the_start_and_shows_the_load(
    model_path: Path,
) -> None:
    backend = LocalBackend(LocalConfig(n_ctx=2048))
    # The load is held open until the panel has drawn it: a cached flash-attention choice
    # makes it quicker than the panel's redraw interval, and no frame would show it.
    gate = threading.Event()
    load = backend._load_inner

    def held() -> None:
        gate.wait(60)
        load()

    backend._load_inner = held  # type: ignore[method-assign]
    app = PhasechatApp(settings=Settings(max_tokens=4, temperature=0), backend=backend)
    headlines: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: backend.state != "idle")
        assert backend.state == "loading"
        welcome = str(app.query_one(Welcome).render())
        size = f"{(await asyncio.to_thread(model_path.stat)).st_size / 1e6:,.0f} MB"
        assert f"local · {SMOLLM2_FILE} · " in welcome and size in welcome, welcome
        assert "(default model)" not in welcome and "not loaded" not in welcome

        panel = app.query_one(LivePanel)
        show = panel.show

        def seen(lines: list[object]) -> None:
            show(lines)  # type: ignore[arg-type]
            headlines.append(panel._content.plain.split("\n")[0])

        panel.show = seen  # type: ignore[method-assign,assignment]
        app.chat.send("Hi.")
        await wait_for(pilot, lambda: any(h.startswith("loading the model") for h in headlines))
        gate.set()
        await settled(pilot, app, 1)
        m = app.turns.exchanges[0].metrics
        assert m is not None and m.load_ms is not None
        assert any(h.startswith("loading the model") for h in headlines), headlines[:5]
        footer = str(list(app.query(MessageView))[-1].query_one(".footer").render())
        assert "this answer waited for the model to load" in footer, footer
        verdict_line = str(app.query(VerdictLine).last().render())
        assert verdict_line.startswith("load-bound ("), verdict_line
    await backend.aclose()


def test_a_frame_before_the_send_has_waited_for_nothing() -> None:
    # The app may draw between a turn's start and its send, when t_sent is still 0: the
    # panel showed "prefilling 17 tokens   TTFT 8,504.55 s" (the clock since boot).
    trace = Trace("local", "m", prompt_estimate=17)
    live = snapshot(trace, 8_504_550_000_000)
    assert live.elapsed_ms == 0.0
    assert live.ttft_ms is None and live.load_ms is None
