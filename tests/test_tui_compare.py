"""Replaying the last prompt on another backend, from its key and from the palette: the
real local model beside a real llama-server, and the local model with other settings."""

from __future__ import annotations

import pytest
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import OptionList, Static

from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import SIDE_TRIP, CompareScreen
from phasechat.tui.screens.switch_screen import SwitchScreen
from tests.helpers import stored_messages, wait_for

pytestmark = [pytest.mark.model, pytest.mark.server]


async def pick(pilot: Pilot[None], name: str) -> None:
    """Choose `name` in the picker as a user does: move to it, press Enter."""
    screen = pilot.app.screen
    assert isinstance(screen, SwitchScreen)
    options = screen.query_one(OptionList)
    options.focus()
    ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
    options.highlighted = ids.index(name)
    await pilot.press("enter")


def shown(screen: CompareScreen, n: int) -> str:
    return str(screen.query_one(f"#compare-text-{n}", Static).render())


async def both_done(pilot: Pilot[None]) -> CompareScreen:
    screen = pilot.app.screen
    assert isinstance(screen, CompareScreen)
    c = screen.comparison
    await wait_for(pilot, lambda: len(c.of(0)) == 1 and len(c.of(1)) == 1)
    await pilot.pause(0.2)  # one more refresh of the view
    return screen


async def test_replay_on_a_server_and_on_other_settings_leaves_the_chat_alone(
    local_backend: LocalBackend, real_llama_server: str
) -> None:
    remote = BackendSpec("openai", remote=RemoteConfig(base_url=real_llama_server, name="server"))
    app = PhasechatApp(
        settings=Settings(max_tokens=8, temperature=0), backend=local_backend, profiles=[remote]
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.backend.state == "ready")
        app.chat.send("Name a colour.")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        chat = [(m.role, m.content, m.status) for m in app.turns.conversation.messages]
        saved = [tuple(r) for r in stored_messages()]

        await pilot.press("f5")  # the key
        picker = app.screen
        assert isinstance(picker, SwitchScreen)
        costs = {spec.name: cost for spec, cost in picker.profiles}
        assert "server" in costs and "history" in costs["server"]  # the switcher's preview
        assert "local" not in costs  # not against itself, only with other settings
        assert "local(temperature=0.8)" in costs and "local(threads=1)" in costs
        await pick(pilot, "server")
        screen = await both_done(pilot)
        a, b = screen.comparison.of(0)[0], screen.comparison.of(1)[0]
        assert a.text and b.text
        assert shown(screen, 0).startswith(a.text.strip()[:5])
        assert shown(screen, 1).startswith(b.text.strip()[:5])
        assert a.metrics is not None and b.metrics is not None
        assert a.metrics.backend == "local" and b.metrics.backend == "server"
        table = str(screen.query_one("#compare-table", Static).render())
        assert "TTFT" in table and "decode" in table and "B/A" in table
        assert SIDE_TRIP in str(screen.query_one("#compare-head", Static).render())
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)

        await pilot.press("ctrl+p")  # the palette
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"Compare the last")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, SwitchScreen))
        await pick(pilot, "local(temperature=0.8)")
        screen = await both_done(pilot)
        assert not screen.comparison.together  # one local model: A, then B
        b = screen.comparison.of(1)[0]
        assert b.text and b.request.temperature == 0.8
        assert shown(screen, 1).startswith(b.text.strip()[:5])
        await pilot.press("escape")

        # a side trip: the chat and its saved record are as they were
        assert [(m.role, m.content, m.status) for m in app.turns.conversation.messages] == chat
        assert [tuple(r) for r in stored_messages()] == saved
        assert len(app.turns.exchanges) == 1 and app.backend is local_backend

        # leaving while the local model streams the replay stops it: the chat goes on
        app.chat.send("Write a long story about a lighthouse keeper.")  # a long answer to replay
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        app.turns.update_settings(max_tokens=300)
        await pilot.press("f5")
        await pick(pilot, "local(temperature=0.8)")
        replay = pilot.app.screen  # (app.screen: mypy still takes it for the palette)
        assert isinstance(replay, CompareScreen)
        await wait_for(
            pilot, lambda: (x := replay.comparison.latest(0)) is not None and x.trace.tokens >= 3
        )
        await pilot.press("escape")
        stopped = replay.comparison.latest(0)
        assert stopped is not None and stopped.trace.finish == "cancelled" and stopped.done
        app.turns.update_settings(max_tokens=8)
        app.chat.send("Another colour?")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 3 and not app.chat.generating)
        assert app.turns.exchanges[2].answer.status == "complete"
