"""Prompt anatomy in the chat UI, mostly on the bundled model: while a question is edited the
panel says what the edit keeps cached and what it reads again, and the send then reads
exactly that; the system prompt's edit says it re-reads the whole chat."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    PrefillProgress,
    TextDelta,
)
from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.prompt_view import CACHE_MARK, PromptView
from phasechat.tui.widgets.chat_widgets import LivePanel, MessageView, PromptInput
from tests.helpers import send_each, settled, wait_for
from tests.scripted import ScriptedBackend


def panel_text(app: PhasechatApp) -> str:
    return app.query_one(LivePanel)._content.plain


async def edit_forecast(pilot: Pilot[None], app: PhasechatApp, draft: str) -> str:
    """Put `draft` in the prompt box being edited; the panel's forecast line for it."""
    app.query_one(PromptInput).text = draft
    editing = app.chat._editing
    assert editing is not None
    await wait_for(pilot, lambda: app.chat._edit_forecast.of(editing.id, draft) is not None)
    expected = app.chat._edit_forecast.of(editing.id, draft)
    assert expected is not None
    await wait_for(pilot, lambda: expected.line() in panel_text(app))
    line = next(x for x in panel_text(app).splitlines() if "edit " in x)
    return line[line.index("edit ") :]


@pytest.mark.model
async def test_an_edit_forecasts_what_the_send_then_keeps_and_reads(
    local_backend: LocalBackend,
) -> None:
    settings = Settings(system="Be brief.", max_tokens=12, temperature=0)
    app = PhasechatApp(settings=settings, backend=local_backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await send_each(pilot, app, ("Name a colour.", "Name a fruit.", "Name a tree."))
        # the panel's bar: what the prefill paid for; F8: the prompt, as the engine read it
        assert "prompt ░" in panel_text(app) and "read " in panel_text(app)
        await pilot.press("f8")
        await pilot.pause()
        view = app.screen
        assert isinstance(view, PromptView)
        text = view.query_one("#text", Static).render()
        shown = str(text)
        assert "<|im_start|>system" in shown and "⟨new message 5⟩Name a tree." in shown
        assert shown.count(CACHE_MARK) == 1  # the second answer's prompt ended cached there
        last = app.turns.exchanges[-1].metrics
        assert last is not None and last.cached_tokens
        table = str(view.query_one("#head", Static).render())
        assert f"the prompt{last.prompt_tokens:>15,}" in table
        await pilot.press("escape")

        question_2 = [v for v in app.query(MessageView) if v.message.content == "Name a fruit."]
        question_2[0].focus()
        await pilot.press("e")
        line = await edit_forecast(pilot, app, "Name a vegetable.")
        found = re.search(r"keeps ([\d,]+) cached, reads ([\d,]+) again", line)
        assert found, line
        keeps, reads = (int(g.replace(",", "")) for g in found.groups())
        assert keeps > 0 and reads > 0
        await pilot.press("enter")
        await settled(pilot, app, 4)
        sent = app.turns.exchanges[-1].metrics
        assert sent is not None
        assert (sent.cached_tokens, sent.evaluated_prompt_tokens) == (keeps, reads), line
        # the engine held question 2 as it was: the break is there, with the words
        broke = next(x for x in panel_text(app).splitlines() if "cache broke" in x)
        assert "cache broke in message 3 at character 7: `" in broke, broke
        assert "Name a fruit." in broke and "Name a vegetable." in broke

        app.query(MessageView).first().focus()  # the system prompt
        await pilot.press("e")
        line = await edit_forecast(pilot, app, "Answer in French.")
        assert line.startswith("edit a new system prompt re-reads the whole chat:"), line


class SlowPrefill(ScriptedBackend):
    """One token per character of a simple template; a prefill that stops midway in
    the new message until `go` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    @staticmethod
    def templated(messages: tuple[Message, ...]) -> str:
        return "".join(f"<{m.role}>{m.content}</>" for m in messages)

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        text = self.templated(messages)
        return RenderedPrompt(text, tuple(c.encode() for c in text), "tokenizer")

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        text = self.templated(request.messages)
        midway = text.rindex("</>") - 2  # two characters before the new message's end
        yield PrefillProgress(len(text), 0, midway, 5.0)
        await self.go.wait()
        yield TextDelta("ok")
        yield Finished("stop")


async def test_a_long_prefill_says_which_section_it_is_reading() -> None:
    backend = SlowPrefill()
    app = PhasechatApp(settings=Settings(system="Be brief."), backend=backend)
    async with app.run_test(size=(120, 30)) as pilot:
        app.chat.send("A long question.")
        await wait_for(pilot, lambda: "reading new message 1" in panel_text(app))
        assert "prefilling" in panel_text(app)
        backend.go.set()
        await settled(pilot, app, 1)
        assert "reading" not in panel_text(app)
