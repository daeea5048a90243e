"""The table of commands (tui/commands.py): the keys, the footer and the palette are
built from it, so each command is declared once and its key and palette entry run the
same action."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.actions import parse
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from phasechat.tui.app import PhasechatApp
from phasechat.tui.chat_screen import ACTIONS, ChatScreen
from phasechat.tui.commands import COMMANDS, Command, Key, bindings, palette_entries
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend


def test_each_command_has_one_id_one_key_one_place_in_the_footer_and_one_title() -> None:
    keyed = [c.key for c in COMMANDS if c.key is not None]
    assert len({c.id for c in COMMANDS}) == len(COMMANDS)
    assert len({k.keys for k in keyed}) == len({k.slot for k in keyed}) == len(keyed) == 13
    titles = [c.title for c in COMMANDS if c.title]
    assert len(titles) == len(set(titles)) == 16


def test_every_action_of_the_table_is_a_method_of_the_chat_screen_or_the_app() -> None:
    missing = []
    for command in COMMANDS:
        namespace, name, _arguments = parse(command.action)
        owner = PhasechatApp if namespace == "app" else ChatScreen
        if not callable(getattr(owner, f"action_{name}", None)):
            missing.append(command.action)
    assert missing == []
    assert [c.id for c in COMMANDS if c.action.startswith("app.")] == ["quit"]


def test_the_bindings_follow_the_footer_slots_not_the_table_order() -> None:
    table = (
        Command("b", "B", "", "b", Key("f2", "Bee", 2)),
        Command("p", "P", "", "p"),
        Command("a", "", "", "a", Key("f1", "Ay", 1, show=False)),
    )
    built = bindings(table)
    assert [(b.key, b.action, b.description, b.id, b.show) for b in built] == [
        ("f1", "chat('a')", "Ay", "a", False),
        ("f2", "chat('b')", "Bee", "b", True),
    ]


async def test_the_footer_shows_the_tables_keys_in_their_slots() -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: bool(app.query(FooterKey)))
        shown = [k.description for k in app.query_one(Footer).query(FooterKey)]
        keys = sorted((c.key for c in COMMANDS if c.key is not None), key=lambda k: k.slot)
        expected = [k.label for k in keys if k.show]
        assert shown[: len(expected)] == expected
        assert shown[:3] == ["Quit", "Stop", "Retry"]


async def test_a_disabled_command_leaves_the_palette_and_its_key_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=(120, 40)) as pilot:
        shown = [e.title for e in palette_entries(app.chat)]
        assert "Request history" in shown
        history = ACTIONS["history"]
        closed = replace(history, enabled=lambda _chat: False)
        table = tuple(closed if c is history else c for c in COMMANDS)
        assert [e.title for e in palette_entries(app.chat, table)] == [
            t for t in shown if t != "Request history"
        ]
        monkeypatch.setitem(ACTIONS, "history", closed)
        await pilot.press("f2")
        await pilot.pause()
        assert app.screen is app.chat  # F2 opened nothing
        monkeypatch.setitem(ACTIONS, "history", history)
        await pilot.press("f2")
        await wait_for(pilot, lambda: len(app.screen_stack) == 2)
