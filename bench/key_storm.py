"""A key storm: a paste in a terminal without bracketed paste reaches the app as one key
event per character (issue 23 item 7). Types N characters into the prompt of the real
app under Textual's `run_test`, fed from a thread in 4 KB reads as the Linux driver does,
once with the prompt as it is (one edit per burst of keys) and once with one edit per
key (TextArea's own way, before the fix), and prints the time until the prompt holds the
whole text, with the ratio.

    .venv/bin/python -m bench.key_storm [--keys 20000] [--keys 5000 10000 20000]

Per key, the old way costs time in proportion to the line typed so far (doubling the
keys quadruples the time); the prompt's way stays flat. Report `uptime`'s load with the
figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from textual import events

import phasechat.tui.app as app_module
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import PromptInput
from tests.scripted import ScriptedBackend

READ = 4096  # the Linux driver reads the terminal 4 KB at a time


class PerKeyInput(PromptInput):
    """The prompt as it was: each typed key is its own edit, at once."""

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and not self.read_only:
            event.prevent_default()
            event.stop()
            start, end = self.selection
            self.replace(event.character or "", start, end, maintain_selection_offset=False)


@contextmanager
def prompt_class(cls: type[PromptInput]) -> Iterator[None]:
    """The app composes `cls` as its prompt."""
    original = app_module.PromptInput
    app_module.PromptInput = cls  # type: ignore[misc]
    try:
        yield
    finally:
        app_module.PromptInput = original  # type: ignore[misc]


def feed(app: PhasechatApp, text: str) -> None:
    """Post `text` as key events from another thread, a read's worth at a time."""
    for at in range(0, len(text), READ):
        for character in text[at : at + READ]:
            app.post_message(events.Key("space" if character == " " else character, character))
        time.sleep(0.001)


async def storm(keys: int, cls: type[PromptInput]) -> tuple[float, float]:
    """Wall and CPU seconds from the first key until the prompt holds all of them."""
    text = ("lorem ipsum dolor sit amet, " * (keys // 28 + 1))[:keys]
    with prompt_class(cls):
        app = PhasechatApp(backend=ScriptedBackend())
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.5)
            prompt = app.query_one(PromptInput)
            assert type(prompt) is cls
            wall, cpu = time.perf_counter(), time.process_time()
            feeder = threading.Thread(target=feed, args=(app, text))
            feeder.start()
            while prompt.text != text:  # noqa: ASYNC110 (polling)
                await asyncio.sleep(0.01)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            feeder.join()
            return wall, cpu


async def main(counts: list[int]) -> None:
    print(f"{'keys':>7} {'one edit per key':>22} {'one edit per burst':>22} {'ratio':>7}")
    print(f"{'':>7} {'wall s':>10} {'CPU s':>11} {'wall s':>10} {'CPU s':>11} {'(wall)':>7}")
    for keys in counts:
        old_wall, old_cpu = await storm(keys, PerKeyInput)
        new_wall, new_cpu = await storm(keys, PromptInput)
        print(
            f"{keys:>7,} {old_wall:>10.2f} {old_cpu:>11.2f} {new_wall:>10.2f} {new_cpu:>11.2f}"
            f" {old_wall / new_wall:>6.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[20_000])
    asyncio.run(main(parser.parse_args().keys))
