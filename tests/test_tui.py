"""The TUI under `App.run_test()`, driving the real bundled model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta
from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.host import BUSY
from phasechat.tui.screens.sweep_screen import SweepScreen, open_sweep
from phasechat.tui.widgets.chat_widgets import MessageView, PromptInput
from phasechat.tui.widgets.markdown_view import MarkdownBody
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend

pytestmark = pytest.mark.model


async def test_type_send_and_get_a_streamed_answer(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=24, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"Hello", "ctrl+j", *"there")
        assert app.query_one(PromptInput).text == "Hello\nthere"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1)
        await wait_for(pilot, lambda: not app.chat.generating)
        exchange = app.turns.exchanges[0]
        assert exchange.user.content == "Hello\nthere"
        assert exchange.answer.status == "complete" and exchange.answer.content
        views = list(app.query(MessageView))
        # the system prompt (Settings' default) is shown above the chat, to edit with `e`
        assert [v.message.role for v in views] == ["system", "user", "assistant"]
        md = views[2].query_one(MarkdownBody)
        assert md.source == exchange.answer.content
        assert app.query_one(PromptInput).text == ""
        footer = str(views[2].query_one(".footer").render())
        assert "TTFT" in footer and "tok/s" in footer
        assert not views[2].query(".thinking")  # a model that does not think: no block


async def test_stop_mid_answer_keeps_partial_text(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=400, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 40)) as pilot:
        app.chat.send("Write a very long story about the ocean.")
        await wait_for(
            pilot,
            lambda: bool(app.turns.exchanges) and app.turns.exchanges[0].trace.tokens >= 5,
        )
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.chat.generating)
        answer = app.turns.exchanges[0].answer
        assert answer.status == "cancelled" and answer.content
        assert app.turns.exchanges[0].trace.tokens < 400
        # the app is usable again at once
        app.turns.update_settings(max_tokens=16)
        app.chat.send("Hi")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        assert app.turns.exchanges[1].answer.status == "complete"


async def test_empty_prompt_is_refused_and_nothing_sent(local_backend: LocalBackend) -> None:
    app = PhasechatApp(backend=local_backend)
    async with app.run_test() as pilot:
        await pilot.press("space", "enter")
        await pilot.pause(0.1)
        assert app.turns.exchanges == []
        assert any("empty prompt" in str(n.message) for n in app._notifications)


class HeldOpen(ScriptedBackend):
    """Streams one word, then waits for `gate` before it ends."""

    def __init__(self) -> None:
        super().__init__(text="first")
        self.gate = asyncio.Event()

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield TextDelta("first ")
        await self.gate.wait()
        yield Finished("stop")


async def test_every_action_that_changes_the_chat_is_refused_while_it_answers() -> None:
    backend = HeldOpen()
    app = PhasechatApp(backend=backend)
    async with app.run_test() as pilot:
        app.chat.send("one")
        await wait_for(pilot, lambda: bool(app.turns.exchanges) and app.chat.generating)
        app.clear_notifications()
        assert app.chat.send("two") is False
        app.chat.action_retry()
        app.chat.action_ablate()
        assert open_sweep(app.chat) is False  # the palette's "Concurrency sweep"
        await pilot.pause()
        said = [str(n.message) for n in app._notifications]
        assert said == [BUSY] * 4  # one line each, the same line, nothing sent
        assert not isinstance(app.screen, SweepScreen)
        assert len(app.turns.exchanges) == 1
        backend.gate.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        assert not app.chat.refused_while_answering() and app.chat.send("two") is True
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
