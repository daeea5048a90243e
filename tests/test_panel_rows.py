"""The live panel shows what matters at every size: it is given ranked lines and draws
those that fit its rows, wrapped as drawn, the most important first (a cache break
before the rates; while editing, the edit's forecast before the engine's account).
These tests read the rows the terminal shows, not the panel's content."""

from __future__ import annotations

import html

from textual.content import Content
from textual.pilot import Pilot

from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import LivePanel, MessageView, PromptInput
from phasechat.tui.widgets.telemetry_view import RANK, PanelLine, fit_lines
from tests.helpers import send_each, settled, wait_for
from tests.test_tui_faults import SVG_TEXT


async def screen_rows(pilot: Pilot[None], top: int, height: int) -> list[str]:
    """The text of screen rows `top` to `top + height` as the terminal shows them (the
    app's SVG screenshot, after a pause for the layout and the drawing)."""
    await pilot.pause(0.3)
    rows: dict[int, list[str]] = {}
    for row, text in SVG_TEXT.findall(pilot.app.export_screenshot()):
        rows.setdefault(int(row), []).append(html.unescape(text).replace("\xa0", " "))
    return ["".join(rows.get(r, [])) for r in range(top, top + height)]


def line(text: str, rank: int) -> PanelLine:
    return PanelLine(Content(text), rank)


def test_the_lines_that_matter_most_fit_first_each_whole_in_their_order() -> None:
    lines = [
        line("headline", RANK["headline"]),
        line("itl" + " x" * 13, RANK["itl"]),  # 29 cells: two rows at 20
        line("engine", RANK["engine"]),
        line("break" + " y" * 12, RANK["break"]),  # two rows
        line("edit", RANK["edit"]),
    ]
    assert [len(x.content.wrap(20)) for x in lines] == [1, 2, 1, 2, 1]
    # 4 rows: edit (1), break (2), headline (1); the rest does not fit
    assert fit_lines(lines, 20, 4).plain.split("\n") == ["headline", lines[3].content.plain, "edit"]
    # a row more: the two rows of the gaps do not fit, the one-row engine line does
    assert fit_lines(lines, 20, 5).plain.split("\n") == [
        "headline",
        "engine",
        lines[3].content.plain,
        "edit",
    ]
    # room for all: all of them, in their order; cut by height they would lose the edit
    assert fit_lines(lines, 20, 7).plain.split("\n") == [x.content.plain for x in lines]
    # before the panel has a size: everything
    assert fit_lines(lines, 0, 0).plain.count("\n") == 4


async def test_break_and_edit_forecast_are_visible_at_three_sizes(
    local_backend: LocalBackend,
) -> None:
    settings = Settings(system="Be brief.", max_tokens=12, temperature=0)
    app = PhasechatApp(settings=settings, backend=local_backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await send_each(pilot, app, ("Name a colour.", "Name a fruit.", "Name a tree."))
        question_2 = [v for v in app.query(MessageView) if v.message.content == "Name a fruit."]
        question_2[0].focus()
        await pilot.press("e")
        app.query_one(PromptInput).text = "Name a vegetable."
        await pilot.press("enter")
        await settled(pilot, app, 4)  # the engine held question 2 as it was: a break
        anatomy = app.turns.exchanges[-1].anatomy
        assert anatomy is not None and anatomy.cache_break is not None

        question_1 = [v for v in app.query(MessageView) if v.message.content == "Name a colour."]
        question_1[0].focus()
        await pilot.press("e")
        draft = "Name a shape."
        app.query_one(PromptInput).text = draft
        editing = app.chat._editing
        assert editing is not None
        await wait_for(pilot, lambda: app.chat._edit_forecast.of(editing.id, draft) is not None)
        panel = app.query_one(LivePanel)
        await wait_for(pilot, lambda: any(x.rank == RANK["edit"] for x in panel._lines))
        meant = {x.rank: x.content.plain for x in panel._lines}
        brk, forecast = meant[RANK["break"]], meant[RANK["edit"]]
        assert brk.startswith("⚠ cache broke") and forecast.startswith("edit keeps ")

        for width, height in ((80, 24), (120, 40), (200, 50)):
            await pilot.resize_terminal(width, height)

            def fitted(w: int = width) -> bool:
                return panel.size.width == w - 2  # its padding

            await wait_for(pilot, fitted)
            shown = await screen_rows(pilot, panel.region.y, panel.region.height)
            visible = "".join("".join(shown).split())  # wrapped rows, spaces aside
            size = f"{width}x{height}"
            assert "".join(brk.split()) in visible, (size, shown)
            assert "".join(forecast.split()) in visible, (size, shown)
            if (width, height) == (80, 24):
                # more than fits: what went is the least important, not the break
                needed = sum(len(x.content.wrap(panel.size.width)) for x in panel._lines)
                assert needed > panel.size.height, (needed, panel.size)
                engine = next(x for x in panel._lines if x.rank == RANK["engine"])
                assert "".join(engine.content.plain.split()) not in visible
