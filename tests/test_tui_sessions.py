"""The TUI's session features: chats saved as they happen, reopened, engine settings
and themes remembered in the config file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import platformdirs
import pytest
from textual.widgets import Input, OptionList, TextArea

from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.file import config_path, load_config
from phasechat.chat.config.settings import Settings
from phasechat.chat.store.database import ChatStore
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.chats_screen import ChatsScreen
from phasechat.tui.screens.settings_screen import SettingsScreen
from phasechat.tui.widgets.chat_widgets import MessageView
from tests.helpers import settled, wait_for

pytestmark = pytest.mark.model


async def test_chat_is_saved_and_reopened(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=8, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 36)) as pilot:
        app.chat.send("Remember the word lighthouse.")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        answer = app.turns.exchanges[0].answer.content
        app.chat.action_new_chat()
        await wait_for(
            pilot, lambda: [v.message.role for v in app.query(MessageView)] == ["system"]
        )
        app.chat.send("A second chat.")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        await pilot.press("f3")
        screen = app.screen
        assert isinstance(screen, ChatsScreen)
        await pilot.pause()
        # search finds the first chat only
        screen.query_one("#search", Input).value = "lighthouse"
        options = screen.query_one(OptionList)
        # the search narrows the list when it has run: waited for, not timed
        await wait_for(pilot, lambda: options.option_count == 1)
        options.highlighted = 0
        options.action_select()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen))
        await pilot.pause(0.2)
        shown = [v.message.content for v in app.query(MessageView)]
        assert shown == [Settings().system, "Remember the word lighthouse.", answer]
    with ChatStore() as store:
        chats = store.list_chats()
        assert len(chats) == 2 and all(c.messages == 2 for c in chats)


async def test_settings_are_applied_and_saved(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(), backend=local_backend)
    async with app.run_test(size=(100, 60)) as pilot:
        await pilot.press("f4")
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#system", TextArea).text = "Answer in French."
        screen.query_one("#max_tokens", Input).value = "abc"
        screen.save()
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)  # refused, with a message naming the field
        assert "max_tokens" in str(screen.query_one("#error").render())
        screen.query_one("#max_tokens", Input).value = "7"
        screen.query_one("#stop", Input).value = '["\\n\\n"]'
        screen.save()
        await pilot.pause()
        assert app.turns.settings.max_tokens == 7
        assert app.turns.settings.system == "Answer in French."
        assert app.turns.settings.stop == ("\n\n",)
        app.chat.send("Bonjour")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        assert app.turns.exchanges[0].trace.tokens <= 7
    saved = load_config()
    assert saved.engine.max_tokens == 7 and saved.engine.system == "Answer in French."


async def test_theme_is_remembered_and_broken_user_theme_is_skipped(
    local_backend: LocalBackend,
) -> None:
    themes = config_path().parent / "themes"
    themes.mkdir(parents=True)
    (themes / "sunset.toml").write_text('name = "sunset"\nprimary = "#ff7700"\ndark = true\n')
    (themes / "broken.toml").write_text('name = "broken"\nprimary = "not a colour"\n')
    app = PhasechatApp(backend=local_backend)
    async with app.run_test() as pilot:
        assert "sunset" in app.available_themes and "broken" not in app.available_themes
        assert any("broken.toml" in str(n.message) for n in app._notifications)
        app.theme = "sunset"
        await pilot.pause(0.1)
    assert tomllib.loads(config_path().read_text())["theme"] == "sunset"
    again = PhasechatApp(backend=local_backend, config=load_config())
    async with again.run_test():
        assert again.theme == "sunset"


def test_data_and_config_follow_xdg(tmp_path: Path) -> None:
    assert Path(platformdirs.user_data_dir("phasechat")).is_relative_to(tmp_path)
    assert config_path().is_relative_to(tmp_path)


async def test_trimmed_turns_are_marked_and_the_panel_shows_the_cut(
    local_backend: LocalBackend,
) -> None:
    from phasechat.chat.config.file import Config
    from phasechat.chat.config.settings import TrimConfig
    from phasechat.tui.widgets.chat_widgets import LivePanel

    config = Config(trim=TrimConfig(budget=160, keep_last=2))
    app = PhasechatApp(
        settings=Settings(max_tokens=24, temperature=0), backend=local_backend, config=config
    )
    async with app.run_test(size=(110, 40)) as pilot:
        assert app.turns.trimmer.budget == 160 and app.turns.trimmer.keep_last == 2
        for n in range(1, 9):
            app.chat.send(f"Turn {n}: tell me one fact about the number {n}.")
            await settled(pilot, app, n)
            if app.turns.trimmer.summaries:
                break
        await wait_for(pilot, lambda: not app.turns.trimmer.pending, limit_s=180)
        assert app.turns.trimmer.summaries, "the budget was exceeded: a summary was written"
        await wait_for(pilot, lambda: any(v.summarized for v in app.query(MessageView)))
        marked = [v for v in app.query(MessageView) if v.summarized]
        assert marked and all(app.turns.trimmer.is_summarized(v.message) for v in marked)
        # the originals stay on screen and in the conversation
        assert all(v.message.content for v in marked)
        panel = str(app.query_one(LivePanel).render())
        assert "trim" in panel and "summarized" in panel
