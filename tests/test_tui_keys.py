"""Key storms: a paste in a terminal without bracketed paste arrives as one key event per
character (57,900 of them froze the TUI for minutes). The prompt's work per key must not
grow with the text already typed, and the storm must end as exactly the text typed.

The work is counted, not timed: every character TextArea measures to wrap a line or to
place the cursor on it (Textual's `compute_wrap_offsets` and `WrappedDocument.get_sections`,
each a pass over a whole line). `bench/key_storm.py` times the same storm."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from textual import events
from textual._wrap import compute_wrap_offsets
from textual.document import _wrapped_document
from textual.document._wrapped_document import WrappedDocument
from textual.pilot import Pilot

from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import PromptInput
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend


def storm_text(n: int) -> str:
    """`n` printable characters, spaces and a few non-ASCII ones among them."""
    return ("lorem ipsum dolor é 漢字 sit amet, " * (n // 30 + 1))[:n]


def key(character: str) -> events.Key:
    """The event the terminal driver makes for a typed character."""
    return events.Key("space" if character == " " else character, character)


class Measured:
    """Characters of the prompt's lines measured, counted by patching Textual's two
    per-line passes."""

    def __init__(self) -> None:
        self.chars = 0


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Measured:
    counter = Measured()
    wrap = compute_wrap_offsets  # what _wrapped_document imported
    sections = WrappedDocument.get_sections

    def counted_wrap(text: str, *args: Any, **kwargs: Any) -> list[int]:
        counter.chars += len(text)
        return wrap(text, *args, **kwargs)

    def counted_sections(self: WrappedDocument, line_index: int) -> Any:
        counter.chars += len(self.document[line_index])
        return sections(self, line_index)

    monkeypatch.setattr(_wrapped_document, "compute_wrap_offsets", counted_wrap)
    monkeypatch.setattr(WrappedDocument, "get_sections", counted_sections)
    return counter


async def typed(pilot: Pilot[None], app: PhasechatApp, keys: list[events.Key], text: str) -> None:
    """Queue every key before the app handles one (as the driver hands over what it read
    in one go), then let the app run until the prompt holds `text` (or a minute passed:
    the caller's assertion then shows what it holds)."""
    for event in keys:
        app.post_message(event)
    prompt = app.query_one(PromptInput)
    with contextlib.suppress(TimeoutError):
        await wait_for(pilot, lambda: prompt.text == text, limit_s=60)
    await pilot.pause()


async def test_a_key_storm_costs_the_same_per_key_at_any_length(measured: Measured) -> None:
    per_key = {}
    for n in (1_000, 4_000):
        app = PhasechatApp(backend=ScriptedBackend())
        async with app.run_test(size=(100, 30)) as pilot:
            text = storm_text(n)
            before = measured.chars
            await typed(pilot, app, [key(c) for c in text], text)
            per_key[n] = (measured.chars - before) / n
            assert app.query_one(PromptInput).text == text
    # Before the fix each key measured the whole line typed so far: 4x the keys cost
    # 16x the work (4x per key). Now a storm is measured once per batch of keys.
    assert per_key[4_000] <= 1.5 * per_key[1_000], per_key
    assert per_key[4_000] < 20, per_key


async def test_a_key_storm_ends_as_exactly_the_text_typed() -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    head, first, second = storm_text(1_000), storm_text(900)[::-1], "-" + storm_text(800)
    # a newline typed in the storm (Ctrl+J) keeps its place among the characters
    keys = [*map(key, head), events.Key("ctrl+j", None), *map(key, first)]
    keys += [events.Key("ctrl+j", None), *map(key, second)]
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        await typed(pilot, app, keys, f"{head}\n{first}\n{second}")
        assert prompt.text == f"{head}\n{first}\n{second}"
        assert prompt.cursor_location == (2, len(second))
        # moved back two, a storm goes in at the cursor, which stays after it
        await pilot.press("left", "left")
        moved = f"{head}\n{first}\n{second[:-2]}XYZ{second[-2:]}"
        await typed(pilot, app, list(map(key, "XYZ")), moved)
        assert prompt.text == moved
        assert prompt.cursor_location == (2, len(second) + 1)
        # typed keys replace a selection, as before
        prompt.select_all()
        await typed(pilot, app, [key("x"), key("y")], "xy")
        assert prompt.text == "xy" and prompt.cursor_location == (0, 2)


async def test_enter_in_a_storm_sends_the_text_typed_before_it() -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    sent: list[str] = []

    def send(text: str) -> bool:
        sent.append(text)
        return True

    app.chat.send = send  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        keys = [*map(key, "first line"), events.Key("enter", "\r"), *map(key, "next")]
        await typed(pilot, app, keys, "first linenext")
        await wait_for(pilot, lambda: bool(sent), limit_s=60)
        assert sent == ["first line"]
        # the app did not clear the prompt (send is replaced): the keys after Enter follow
        assert app.query_one(PromptInput).text == "first linenext"


async def test_undo_after_a_storm_restores_the_text_before_it() -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    text = storm_text(500)
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        await typed(pilot, app, [key(c) for c in "kept"], "kept")
        prompt.history.checkpoint()
        await typed(pilot, app, [key(c) for c in text], "kept" + text)
        assert prompt.text == "kept" + text
        for _ in range(len(text)):  # one undo per key at most; a batch takes fewer
            if prompt.text == "kept":
                break
            prompt.action_undo()
        assert prompt.text == "kept"
        prompt.action_redo()
        assert prompt.text.startswith("kept" + text[:1])
