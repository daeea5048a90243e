"""Issue 47, items 1 and 2, in the app (Pilot): the engine's process stopped (SIGSTOP)
while idle or mid-answer. Keys are drawn, Esc ends the answer with its text kept, the
child is ended and named, the next send answers from a new one, and quitting does not
wait for it. The real bundled model in the real child process; the only bounds are
generous ones that prove "not hung" (far below the 30 s each call used to wait)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.engine_process import EngineProcess
from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.workspace import Workspace
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import PromptInput
from tests.helpers import wait_for

pytestmark = pytest.mark.model

NOT_HUNG_S = 10.0


@contextlib.asynccontextmanager
async def running(
    model_path: Path, max_tokens: int
) -> AsyncIterator[tuple[Pilot[None], PhasechatApp, EngineProcess, int]]:
    """The app on an engine process of its own, the model loaded: the pilot, the app,
    the engine and its child's pid; the child let go (SIGCONT) and the engine closed on
    the way out, so no test leaves a stopped process behind."""
    backend = EngineProcess(LocalConfig(model_path=model_path, n_ctx=1024, flash_attn=True))
    app = PhasechatApp(settings=Settings(max_tokens=max_tokens, temperature=0), backend=backend)
    pid = 0
    try:
        async with app.run_test(size=(100, 40)) as pilot:
            pid = await ready(pilot, backend)
            yield pilot, app, backend, pid
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await backend.aclose()


async def ready(pilot: Pilot[None], backend: EngineProcess) -> int:
    """Wait for the model; the child's pid."""
    await wait_for(pilot, lambda: backend.state == "ready")
    pid = backend.pid
    assert pid is not None
    return pid


async def stopped_mid_answer(pilot: Pilot[None], app: PhasechatApp, pid: int) -> None:
    """A long answer under way, its engine stopped (SIGSTOP) after 3 tokens and silent
    for longer than SILENT_S."""
    app.chat.send("Write a very long story about the ocean.")
    await wait_for(
        pilot, lambda: bool(app.turns.exchanges) and app.turns.exchanges[0].trace.tokens >= 3
    )
    os.kill(pid, signal.SIGSTOP)
    await pilot.pause(1.5)


async def test_enter_on_a_stopped_engine_keeps_the_keys_drawn_and_answers(
    model_path: Path,
) -> None:
    async with running(model_path, max_tokens=8) as (pilot, app, backend, pid):
        os.kill(pid, signal.SIGSTOP)
        await pilot.pause(1.5)  # silent for longer than SILENT_S
        await pilot.click("#prompt")
        t0 = time.monotonic()
        await pilot.press(*"Hi", "enter")
        await pilot.press(*"next")
        # drawn while the answer waits for an engine: the UI never waited on it
        await wait_for(pilot, lambda: app.query_one(PromptInput).text == "next")
        assert time.monotonic() - t0 < NOT_HUNG_S
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        answer = app.turns.exchanges[0].answer
        assert answer.status == "complete" and answer.content  # from a new child
        assert backend.pid not in (None, pid)


async def test_esc_ends_an_answer_whose_engine_stopped_and_keeps_its_text(
    model_path: Path,
) -> None:
    async with running(model_path, max_tokens=400) as (pilot, app, backend, pid):
        await stopped_mid_answer(pilot, app, pid)
        t0 = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.chat.generating)
        assert time.monotonic() - t0 < NOT_HUNG_S
        first = app.turns.exchanges[0].answer
        assert first.status == "cancelled"  # marked
        assert first.content  # the partial text kept
        # the child that does not answer is ended, and the status line says so
        await wait_for(pilot, lambda: backend.state == "failed")
        await wait_for(
            pilot, lambda: "did not answer for" in str(app.query_one("#status").render())
        )
        app.turns.update_settings(max_tokens=8)
        app.chat.send("Hi")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        assert app.turns.exchanges[1].answer.status == "complete"  # from a new child
        assert backend.pid not in (None, pid)


async def test_quit_while_the_engine_is_stopped_mid_answer_does_not_wait_for_it(
    model_path: Path,
) -> None:
    """Built as `phasechat` builds it: the workspace owns the engine and closes it."""
    config = LocalConfig(model_path=model_path, n_ctx=1024, flash_attn=True, own_process=True)
    settings = Settings(max_tokens=400, temperature=0)
    workspace = Workspace(Config(), BackendSpec("local", local=config), settings=settings)
    app = PhasechatApp(workspace=workspace)
    backend = app.backend
    assert isinstance(backend, EngineProcess)
    pid = 0
    try:
        async with app.run_test(size=(100, 40)) as pilot:
            pid = await ready(pilot, backend)
            await stopped_mid_answer(pilot, app, pid)
            t0 = time.monotonic()
            await pilot.press("ctrl+q")
        quit_s = time.monotonic() - t0  # the app has quit, its engine with it
        assert quit_s < NOT_HUNG_S
        answer = app.turns.exchanges[0].answer
        assert answer.status == "cancelled" and answer.content
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # ended and reaped, not left stopped
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await backend.aclose()
