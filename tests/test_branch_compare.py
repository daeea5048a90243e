"""Two sibling branches side by side (chat/trips/branches.py, `c` on a message): their
answers with the figures recorded when they were answered, and `n` runs each again,
cold, on the bundled model; the chat is not touched."""

from __future__ import annotations

from collections import Counter

import pytest

from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.branches import branch_comparison
from phasechat.chat.turns import InputError
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import CompareScreen
from phasechat.tui.widgets.chat_widgets import MessageView
from tests.helpers import COLD_MAX, settled, wait_for
from tests.test_tui_branches import Numbered


async def test_an_edit_compares_each_question_with_its_own_prompt() -> None:
    app = PhasechatApp(settings=Settings(system="Be brief."), backend=Numbered())
    async with app.run_test(size=(110, 36)) as pilot:
        for i, q in enumerate(("q1", "q2"), 1):
            app.chat.send(q)
            await settled(pilot, app, i)
        turns = app.turns
        question = turns.conversation.questions()[1]
        with pytest.raises(InputError, match="no other branch"):
            branch_comparison(turns, question)
        turns.edit(question.id, "q2, edited")
        async for _ in turns.run(turns.exchanges[-1]):
            pass
        edited = turns.conversation.questions()[1]
        c = branch_comparison(turns, edited)
        a, b = (side.messages for side in c.sides)
        assert a is not None and b is not None
        assert [m.content for m in a][-1] == "q2" and [m.content for m in b][-1] == "q2, edited"
        assert a[:-1] == b[:-1]  # the shared start: the system prompt, q1 and its answer
        assert [x.text for x in c.answers] == ["answer 2", "answer 3"]
        assert [s.name for s in c.sides] == ["‹1/2›", "‹2/2›"]


@pytest.mark.model
async def test_c_on_a_retried_answer_then_n_runs_each_again_cold(
    local_backend: LocalBackend,
) -> None:
    settings = Settings(system="Be brief.", max_tokens=6, temperature=0.8)
    app = PhasechatApp(settings=settings, backend=local_backend)
    async with app.run_test(size=(120, 40)) as pilot:
        app.chat.send("Name a colour.")
        await settled(pilot, app, 1)
        await pilot.press("ctrl+r")
        await settled(pilot, app, 2)
        recorded = [e.metrics for e in app.turns.exchanges]
        await pilot.press("ctrl+up")
        assert isinstance(app.focused, MessageView) and app.focused.message.role == "assistant"
        await pilot.press("c")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        c = screen.comparison
        # the recorded figures, the second retry first (the one shown) against the other
        assert Counter(x.metrics.ttft_ms for x in c.answers if x.metrics) == Counter(
            m.ttft_ms for m in recorded if m
        )
        await pilot.press("n")
        await wait_for(pilot, lambda: c.repeat == 3 and all(x.done for x in c.answers))
        assert len(c.of(0)) == len(c.of(1)) == 3
        # every run cold: no more cached than the template's start and the first line
        assert all((x.metrics.cached_tokens or 0) <= COLD_MAX for x in c.answers if x.metrics)
        # the table is drawn once the runs are done: waited for, not timed
        table = screen.query_one("#compare-table")
        await wait_for(pilot, lambda: "TTFT" in str(table.render()))
        assert "output" in str(table.render())
        await pilot.press("escape")
        assert len(app.turns.exchanges) == 2  # the chat was not touched
