"""The command palette (Ctrl+P): the chat's entries come from their own Provider
(tui/palette.py), each calling its function, beside Textual's own."""

from __future__ import annotations

from textual.command import CommandList, CommandPalette
from textual.pilot import Pilot

from phasechat.chat.config.paths import exports_dir
from phasechat.tui.app import PhasechatApp
from phasechat.tui.commands import palette_entries
from phasechat.tui.screens.sweep_screen import SweepScreen
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend


class OneAtATime(ScriptedBackend):
    """A backend that answers one request at a time, as the local model does."""

    serial = True


def said(app: PhasechatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def listed(app: PhasechatApp) -> list[str]:
    """The palette's entries as shown: each option's first line (its title)."""
    options = app.screen.query_one(CommandList).options
    return [str(option.prompt).split("\n")[0] for option in options]


async def run_command(pilot: Pilot[None], app: PhasechatApp, title: str) -> None:
    """Open the palette, type `title`, wait for it to be the first entry, press Enter."""
    await pilot.press("ctrl+p")
    assert isinstance(app.screen, CommandPalette)
    await pilot.press(*title)
    await wait_for(pilot, lambda: listed(app)[:1] == [title])
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette))


async def test_the_palette_lists_the_chats_entries_in_the_apps_order_and_textuals_own() -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=(120, 50)) as pilot:
        ours = [entry.title for entry in palette_entries(app.chat)]
        assert len(ours) == len(set(ours)) == 16  # the fifteen of before and the sweep
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: {"Quit", "Concurrency sweep"} <= set(listed(app)))
        shown = listed(app)
        # ours in the app's order (Textual's may come between): never sorted by title
        assert [title for title in shown if title in ours] == ours
        assert ours != sorted(ours)
        assert "Theme" in shown and "Keys" in shown  # Textual's entries are kept


async def test_a_palette_entry_runs_its_own_function() -> None:
    app = PhasechatApp(backend=ScriptedBackend(text="a saved answer"))
    async with app.run_test(size=(120, 50)) as pilot:
        app.chat.send("a question")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        await run_command(pilot, app, "Export this chat")
        md = exports_dir() / f"chat-{app.workspace.chat_id()}-memory.md"
        await wait_for(pilot, lambda: md.exists())
        assert "a saved answer" in md.read_text()

        trimming = app.workspace.config.trim.enabled
        await run_command(pilot, app, "Toggle history trimming")
        assert app.workspace.config.trim.enabled is not trimming
        assert app.turns.trimmer.enabled is not trimming  # the controller's, not only saved
        assert f"history trimming {'off' if trimming else 'on'}" in said(app)


async def test_the_palettes_sweep_is_refused_for_a_backend_that_answers_one_at_a_time() -> None:
    app = PhasechatApp(backend=OneAtATime())
    async with app.run_test(size=(120, 50)) as pilot:
        await run_command(pilot, app, "Concurrency sweep")
        await pilot.pause()
        assert not isinstance(app.screen, SweepScreen)
        assert any("needs a remote backend" in line for line in said(app))
