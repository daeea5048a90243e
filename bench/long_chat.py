"""A long chat in the UI (issue 38 item 3): a saved chat of N messages on one branch is
opened in the real app under Textual's `run_test`, in a data folder of its own (never
the user's), and timed as a user meets it:

- **last screen**: from the open until the newest message is on screen and a frame has
  been drawn with it;
- **keys**: a character typed into the prompt every 50 ms from 0.5 s after the open
  until the chat has finished drawing (and at least 2 s), each timed until the prompt
  holds it: the first one (what Ctrl+Q at 0.5 s waited), the median and the worst;
- **page up**: 40 Page Ups (~200 messages up), each until a frame has been drawn, with
  keys typed meanwhile timed the same way (their worst); then **home**: Home pressed on
  a message until the chat's first message is on screen;

then, in a chat of its own, a 1 MB answer of 100k lines (streamed by a scripted
backend, one line per event), answered twice (Ctrl+R: a sibling) and followed by one
more question, and the time each view takes from its key until its screen has been
drawn: `c` (the two branches side by side), F8 (the next answer's prompt: 1 MB of
history) and `t` (the answer's timeline: 100k token events).

    .venv/bin/python -m bench.long_chat [--messages 1000 2000 5000] [--no-views]

Goals: the last screen within 0.5 s and every key within 100 ms at 5,000 messages; each
view within 1 s. Report `uptime`'s load with the figures: the machine is shared (the
load is printed beside each row).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from textual import events
from textual.pilot import Pilot
from textual.screen import Screen

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.store.database import ChatStore
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import CompareScreen
from phasechat.tui.screens.prompt_view import PromptView
from phasechat.tui.screens.timeline_view import TimelineView
from phasechat.tui.widgets.chat_log import ChatLog
from phasechat.tui.widgets.chat_widgets import MessageView, PromptInput
from tests.scripted import ScriptedBackend

SIZE = (120, 40)
KEY_EVERY_S = 0.05
PAGES = 40  # Page Ups (~200 messages up at 120x40)
LINES = 100_000  # the long answer's lines: "line 00001\n", 1.1 MB in all

ANSWER = (
    "Here is answer {n}, with a little **Markdown** in it:\n\n"
    "- one point\n- another point, `code` in it\n\n"
    "And a closing line of prose that wraps in a narrow terminal, as answers do.\n"
)


def load() -> str:
    """The machine's 1-minute load average (other sessions share it)."""
    return f"{os.getloadavg()[0]:.2f}"


def saved_chat(messages: int) -> int:
    """A saved chat of `messages` messages on one branch (questions and answers, each
    answer with its figures); returns its id."""
    metrics = metrics_from_dict(
        {"backend": "scripted", "model": "m", "finish": "stop", "ttft_ms": 120.0,
         "e2e_ms": 900.0, "prompt_tokens": 400, "output_tokens": 60, "decode_tok_s": 70.0}
    )  # fmt: skip
    with ChatStore() as store:
        chat = store.create_chat(f"{messages} messages", "")
        parent = None
        for i in range(messages):
            if i % 2 == 0:
                m = ChatMessage("user", f"Question {i // 2 + 1}: how does this work?")
            else:
                m = ChatMessage(
                    "assistant", ANSWER.format(n=i // 2 + 1), "scripted", "m", metrics=metrics
                )
            parent = store.add_message(chat, m, parent)
    return chat


class Typist:
    """Types a character into the prompt every KEY_EVERY_S and times each until the
    prompt holds it (posted directly: Pilot.press waits for the app to go idle)."""

    def __init__(self, app: PhasechatApp) -> None:
        self.app = app
        self.ms: list[float] = []
        self._typed = 0

    async def type_until(self, done: Callable[[], bool], at_least_s: float = 0.0) -> None:
        prompt = self.app.query_one(PromptInput)
        until = time.perf_counter() + at_least_s
        while not done() or time.perf_counter() < until:
            t0 = time.perf_counter()
            self.app.post_message(events.Key("x", "x"))
            self._typed += 1
            while prompt.text.count("x") < self._typed:  # noqa: ASYNC110 (polling is the point)
                await asyncio.sleep(0.001)
            self.ms.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(KEY_EVERY_S)


async def drawn(app: PhasechatApp) -> None:
    """Return once a frame has been drawn (what is mounted now is on screen)."""
    event = asyncio.Event()
    app.call_after_refresh(event.set)
    await event.wait()


async def wait(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110 (polling is the point)
        await asyncio.sleep(0.002)


def visible(log: ChatLog, message: ChatMessage) -> bool:
    """Whether `message` is mounted in the log and inside its visible region."""
    for view in log.query_children(MessageView):
        if view.message is message:
            region = view.region
            return bool(region) and bool(region.intersection(log.region))
    return False


async def open_long(messages: int) -> dict[str, float]:
    chat = saved_chat(messages)
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)  # start-up work (first layout, tiktoken) out of the way
        log = app.query_one(ChatLog)
        finished = asyncio.Event()

        async def open_it() -> None:  # what F3's chosen chat does (tui/dialogs.py)
            await app.chat.stop_and_wait()
            app.workspace.open_chat(chat)
            await app.chat.show_conversation(app.turns.conversation)
            finished.set()

        t0 = time.perf_counter()
        app.run_worker(open_it(), group="chat")

        async def last_screen() -> float:
            await wait(lambda: visible(log, app.turns.conversation.path()[-1]))
            await drawn(app)
            return time.perf_counter() - t0

        shown = asyncio.create_task(last_screen())
        await asyncio.sleep(max(0.0, t0 + 0.5 - time.perf_counter()))
        typist = Typist(app)
        await typist.type_until(finished.is_set, at_least_s=2.0)
        first_s = await shown
        open_ms = list(typist.ms)

        # PAGES Page Ups, each until a frame is drawn, keys typed meanwhile.
        path = app.turns.conversation.path()
        t1 = time.perf_counter()

        async def page_up() -> float:
            for _ in range(PAGES):
                log.scroll_page_up(animate=False)
                await drawn(app)
            return time.perf_counter() - t1

        paging = asyncio.create_task(page_up())
        typist.ms.clear()
        await typist.type_until(paging.done)
        paged_s = await paging
        paged_ms = max(typist.ms, default=0.0)
        # Home (from a message) until the first message is on screen.
        await pilot.pause(1.0)  # the last batch in
        list(log.query_children(MessageView))[-1].focus()
        await pilot.pause(0.2)
        first = path[1]
        t2 = time.perf_counter()
        app.post_message(events.Key("home", None))
        await wait(lambda: visible(log, first))
        await drawn(app)
        home_s = time.perf_counter() - t2
        mounted = len(log.query_children(MessageView))
        await pilot.press("ctrl+q")
    return {
        "last_screen_s": first_s,
        "key_first_ms": open_ms[0],
        "key_p50_ms": statistics.median(open_ms),
        "key_max_ms": max(open_ms),
        "paged_s": paged_s,
        "paged_key_max_ms": paged_ms,
        "home_s": home_s,
        "mounted": mounted,
    }


class LongAnswers(ScriptedBackend):
    """Answers LINES lines (~1 MB), one line per event; a question with "short" in it
    gets one line."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if "short" in request.messages[-1].content:
            yield TextDelta("A short answer.")
        else:
            for i in range(LINES):
                yield TextDelta(f"line {i:05d}\n")
                if i % 500 == 0:
                    await asyncio.sleep(0)
        yield Finished("stop")


async def settle(pilot: Pilot[None], app: PhasechatApp, answers: int) -> None:
    while len(app.turns.exchanges) < answers or app.chat.generating:
        await pilot.pause(0.1)


async def timed_view(
    pilot: Pilot[None], app: PhasechatApp, key: str, screen: type[Screen[None]]
) -> float:
    """Seconds from `key` until `screen` is up and a frame has been drawn; then closed."""
    t0 = time.perf_counter()
    app.post_message(events.Key(key, None))
    await wait(lambda: isinstance(app.screen, screen))
    await drawn(app)
    await drawn(app)  # the first frame of a new screen is its layout
    seconds = time.perf_counter() - t0
    await pilot.press("escape")
    await wait(lambda: not isinstance(app.screen, screen))
    await pilot.pause(0.2)
    return seconds


async def views() -> dict[str, float]:
    app = PhasechatApp(backend=LongAnswers())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        app.chat.send("a long answer, please")
        await settle(pilot, app, 1)
        await pilot.press("ctrl+r")  # its sibling: `c` compares the two
        await settle(pilot, app, 2)
        size = len(app.turns.exchanges[-1].answer.content.encode())
        app.chat.send("short, now")  # its prompt holds the long answer: what F8 shows
        await settle(pilot, app, 3)
        await pilot.pause(0.5)
        answers = [v for v in app.query(MessageView) if v.message.role == "assistant"]
        answers[0].focus()  # the long answer (‹2/2›)
        await pilot.pause(0.2)
        compare = await timed_view(pilot, app, "c", CompareScreen)
        answers[0].focus()
        timeline = await timed_view(pilot, app, "t", TimelineView)
        app.query_one(PromptInput).focus()
        prompt = await timed_view(pilot, app, "f8", PromptView)
        await pilot.press("ctrl+q")
    return {"bytes": size, "c_s": compare, "f8_s": prompt, "t_s": timeline}


async def main(counts: list[int], with_views: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="phasechat-bench-") as home:
        for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            os.environ[var] = str(Path(home) / var.lower())
        os.environ.pop("PHASECHAT_CONFIG", None)
        print(
            f"{'messages':>8} {'last screen':>11} {'key first':>10} {'key p50':>8} {'key max':>8}"
            f" {'page up':>8} {'its key max':>11} {'home':>5} {'mounted':>8} {'load':>5}"
        )
        print(f"{'':>8} {'s':>11} {'ms':>10} {'ms':>8} {'ms':>8} {'s':>8} {'ms':>11} {'s':>5}")
        for n in counts:
            before = load()
            r = await open_long(n)
            print(
                f"{n:>8,} {r['last_screen_s']:>11.2f} {r['key_first_ms']:>10.0f}"
                f" {r['key_p50_ms']:>8.0f} {r['key_max_ms']:>8.0f} {r['paged_s']:>8.2f}"
                f" {r['paged_key_max_ms']:>11.0f} {r['home_s']:>5.2f} {r['mounted']:>8,.0f}"
                f" {before:>5}",
                flush=True,
            )
        if with_views:
            before = load()
            v = await views()
            print(
                f"\nviews on a {v['bytes'] / 1e6:.2f} MB answer of {LINES:,} lines"
                f" (s from the key to the view drawn; load {before}):"
                f"  c {v['c_s']:.2f}   F8 {v['f8_s']:.2f}   t {v['t_s']:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[1000, 2000, 5000])
    parser.add_argument("--no-views", action="store_true", help="only the opening")
    args = parser.parse_args()
    asyncio.run(main(args.messages, not args.no_views))
