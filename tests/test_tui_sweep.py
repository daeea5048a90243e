"""The verdict under each answer and the sweep screen, in the TUI: the real bundled model,
a real llama-server with 4 slots, and an SVG snapshot of the sweep chart on fixed data."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from phasechat.backends.events import Event, GenerationRequest, Notice
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.sweep import LevelRun, SweepResult
from phasechat.telemetry.sweep_stats import Sample, Slo, level
from phasechat.tui.app import PhasechatApp
from phasechat.tui.commands import palette_entries
from phasechat.tui.screens.sweep_screen import SweepScreen, open_sweep
from phasechat.tui.widgets.chat_widgets import MessageView
from phasechat.tui.widgets.verdict_view import VerdictLine
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend


def text_of(widget: Any) -> str:
    return str(widget.render())


@pytest.mark.model
async def test_an_answer_gets_its_verdict(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=16, temperature=0), backend=local_backend)
    async with app.run_test(size=(110, 40)) as pilot:
        app.chat.send("Hello")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        await wait_for(pilot, lambda: bool(app.query(VerdictLine)))
        answer = list(app.query(MessageView))[-1]
        (line,) = answer.query(VerdictLine)
        said = text_of(line)
        assert "-bound (" in said and "prefill" in said and "decode" in said
        # the local model knows its weights: decode is set against this machine's memory
        assert "of what memory allows" in said


async def test_a_server_answer_says_its_roofline_is_unknown() -> None:
    words = "one two three four five six"  # paced as a server streams: a decode rate
    app = PhasechatApp(backend=ScriptedBackend("remote", words, gap_s=0.005))
    async with app.run_test(size=(110, 30)) as pilot:
        app.chat.send("Hi")
        await wait_for(pilot, lambda: bool(app.query(VerdictLine)))
        said = text_of(app.query_one(VerdictLine))
        assert "roofline unknown: the weights' size is not known" in said


class NoticingBackend(ScriptedBackend):
    """A server that tells two things about its answer: one plain notice (twice, as a
    stream may repeat it) and one doubted figure (which the warnings show)."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield Notice("the server ignored max_tokens (8); stopped here")
        yield Notice("the server ignored max_tokens (8); stopped here")
        yield Notice("ignored usage.prompt_tokens -5 from the server", doubt=True)
        async for event in super().stream(request):
            yield event


async def test_a_notice_about_the_answer_is_shown_under_it_once() -> None:
    app = PhasechatApp(backend=NoticingBackend("remote", "one two three four"))
    async with app.run_test(size=(110, 30)) as pilot:
        app.chat.send("Hi")
        await wait_for(pilot, lambda: bool(app.query(VerdictLine)))
        said = text_of(app.query_one(VerdictLine))
    lines = said.splitlines()
    assert lines[1:] == ["note: the server ignored max_tokens (8); stopped here"]
    assert "usage.prompt_tokens" not in said  # a doubted figure is a warning, shown apart


@pytest.mark.model
async def test_the_palette_refuses_a_sweep_of_the_local_model(local_backend: LocalBackend) -> None:
    app = PhasechatApp(backend=local_backend)
    async with app.run_test() as pilot:
        (command,) = [c for c in palette_entries(app.chat) if "sweep" in c.title]
        command.callback()
        await pilot.pause()
        assert not isinstance(app.screen, SweepScreen)
        assert any("needs a remote backend" in str(n.message) for n in app._notifications)


@pytest.mark.server
async def test_sweep_screen_runs_on_a_real_server(
    start_llama_server: Callable[..., str],
) -> None:
    base = start_llama_server("--parallel", "4", "-c", "4096", "--metrics")
    backend = RemoteBackend(RemoteConfig(base_url=base))
    app = PhasechatApp(settings=Settings(temperature=0), backend=backend)
    async with app.run_test(size=(110, 50)) as pilot:
        await wait_for(pilot, lambda: backend.state == "ready")
        # one run a level (the repeat rule is tests/test_sweep_stats.py's and the CLI's)
        assert open_sweep(app.chat, levels=(1, 2), repeats=1)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        await wait_for(pilot, lambda: screen.result is not None, limit_s=180)
        assert screen.result is not None
        assert [lv.concurrency for lv in screen.result.levels] == [1, 2]
        table = text_of(screen.query_one(".sweep-table")).splitlines()
        rows = [line.split() for line in table if line[:6].strip().isdigit()]
        assert [row[0] for row in rows] == ["1", "2"] and int(rows[0][1]) == 1
        assert table[-1].startswith("warm-up: 1 request")
        assert "concurrent requests" in text_of(screen.query_one(".sweep-chart"))
        assert "knee:" in text_of(screen.query_one(".sweep-notes"))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SweepScreen)
        assert app.turns.exchanges == []  # the chat itself was not touched


def fixed_result() -> SweepResult:
    """A sweep as a 4-slot server draws it: per-user speed falls, the total flattens; each
    level ran 3 times, and 8 five times, still wider than its step from 4 (so no knee)."""
    result = SweepResult("openai", "SmolLM2-135M-Instruct", Slo(ttft_ms=500), 2, 64, repeats=3,
                         max_repeats=5, warm_up_requests=1)  # fmt: skip
    for c, aggregates, per_user, ttft in ((1, (60, 62, 63), 64, 90),
                                          (2, (110, 112, 115), 58, 120),
                                          (4, (165, 171, 176), 45, 210),
                                          (8, (168, 180, 190, 175, 185), 23, 900)):  # fmt: skip
        n = 2 * c
        e2e = ttft + 63 * 1000 / per_user
        samples = [Sample(ttft + i, e2e + i, 64, 50, per_user, (15.6, 16.0)) for i in range(n)]
        runs = [LevelRun(level(c, samples, n * 64 / a, result.slo), samples=samples)
                for a in aggregates]  # fmt: skip
        result.runs.append(LevelRun.pooled(runs, result.slo))
    return result


def test_sweep_screen_snapshot(snap_compare: Any) -> None:
    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        backend = ScriptedBackend("openai")
        await app.push_screen(SweepScreen(backend, Settings(), result=fixed_result()))
        await pilot.pause()

    app = PhasechatApp(backend=ScriptedBackend("openai"))
    assert snap_compare(app, terminal_size=(110, 46), run_before=show)
