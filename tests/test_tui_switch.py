"""Switching backends inside the TUI: the real local model and a real server on 127.0.0.1."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.history_screen import HistoryScreen, export_dir
from phasechat.tui.screens.switch_screen import SwitchScreen
from tests.helpers import settled, wait_for

pytestmark = [pytest.mark.model, pytest.mark.server]


def make_app(local_backend: LocalBackend, server: str, max_tokens: int) -> PhasechatApp:
    remote = BackendSpec("openai", remote=RemoteConfig(base_url=server, name="server"))
    return PhasechatApp(
        settings=Settings(max_tokens=max_tokens, temperature=0),
        backend=local_backend,
        profiles=[remote],
    )


async def test_switch_mid_stream_keeps_partial_and_labels_answers(
    local_backend: LocalBackend, llama_server: str
) -> None:
    app = make_app(local_backend, llama_server, max_tokens=300)
    async with app.run_test(size=(110, 40)) as pilot:
        app.chat.send("Write a long story about a lighthouse keeper.")
        await wait_for(
            pilot,
            lambda: bool(app.turns.exchanges) and app.turns.exchanges[0].trace.tokens >= 5,
        )
        await app.chat.switch_to("server")  # while the local answer streams
        first = app.turns.exchanges[0].answer
        assert first.status == "cancelled" and first.content  # stopped cleanly, partial kept
        assert first.backend == "local"
        assert app.backend.name == "server"
        await wait_for(pilot, lambda: app.backend.state == "ready")
        app.turns.update_settings(max_tokens=12)
        app.chat.send("Now summarise that in one line.")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        second = app.turns.exchanges[1]
        assert second.answer.backend == "server" and second.answer.status == "complete"
        # the conversation carried over: the server got the local answer's text
        assert second.request is not None
        assert any(m.content == first.content for m in second.request.messages)
        # and back to the already-loaded local model, without reloading it
        await app.chat.switch_to("local")
        assert app.backend is local_backend
        app.chat.send("Thanks!")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 3 and not app.chat.generating)
        assert [e.answer.backend for e in app.turns.exchanges] == ["local", "server", "local"]


async def test_switch_screen_shows_measured_cost_and_history_exports(
    local_backend: LocalBackend, llama_server: str
) -> None:
    app = make_app(local_backend, llama_server, max_tokens=8)
    async with app.run_test(size=(110, 40)) as pilot:
        for n, prompt in enumerate(("Hello there, how are you today?", "What is the tallest?"), 1):
            app.chat.send(prompt)
            await settled(pilot, app, n)
        await app.chat.switch_to("server")
        await wait_for(pilot, lambda: app.backend.state == "ready")
        await pilot.press("ctrl+b")
        screen = app.screen
        assert isinstance(screen, SwitchScreen)
        costs = dict((spec.name, cost) for spec, cost in screen.profiles)
        assert "active" in costs["server"]
        assert "re-prefill ≈" in costs["local"]  # local was measured: its own rate is used
        await pilot.press("escape")
        await pilot.press("f2")
        history = app.screen
        assert isinstance(history, HistoryScreen)
        assert history.query_one(DataTable).row_count == 2
        await pilot.press("j", "c")
        files = sorted(p.suffix for p in export_dir().iterdir())
        assert ".csv" in files and ".jsonl" in files
