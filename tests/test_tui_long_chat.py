"""A long chat in the UI (issue 38 item 3): a saved chat of thousands of messages opens
with only its newest messages mounted, older ones come as the user scrolls up (in order,
none twice, the view kept in place), and the views of a very long text (the branch
comparison, the prompt view, the timeline) draw its start and end with a line that says
what was left out. No timings here: bench/long_chat.py measures them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from textual.pilot import Pilot
from textual.widgets import Static

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.store.database import ChatStore
from phasechat.telemetry.anatomy import Anatomy, Section
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.timeline import Timeline
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import CompareScreen
from phasechat.tui.screens.prompt_view import PromptView, marked_text
from phasechat.tui.screens.timeline_view import shaded_text
from phasechat.tui.widgets import clip
from phasechat.tui.widgets.chat_log import FIRST_VIEWS, MAX_VIEWS, ChatLog, shown_messages
from phasechat.tui.widgets.chat_widgets import MessageView
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend

METRICS = metrics_from_dict(
    {"backend": "scripted", "model": "m", "finish": "stop", "ttft_ms": 100.0,
     "e2e_ms": 900.0, "prompt_tokens": 40, "output_tokens": 6}
)  # fmt: skip


def saved_chat(messages: int) -> int:
    """A saved chat of `messages` numbered messages on one branch; returns its id."""
    with ChatStore() as store:
        chat = store.create_chat("long", "")
        parent = None
        for i in range(messages):
            if i % 2 == 0:
                m = ChatMessage("user", f"question {i}")
            else:
                m = ChatMessage("assistant", f"answer {i}", "scripted", "m", metrics=METRICS)
            parent = store.add_message(chat, m, parent)
    return chat


async def opened(pilot: Pilot[None], app: PhasechatApp, chat: int) -> ChatLog:
    """Open saved chat `chat` as F3 does, and let it draw."""
    app.workspace.open_chat(chat)
    await app.chat.show_conversation(app.turns.conversation)
    await pilot.pause()
    return app.query_one(ChatLog)


@asynccontextmanager
async def long_chat(
    messages: int, backend: ScriptedBackend | None = None
) -> AsyncIterator[tuple[Pilot[None], PhasechatApp, ChatLog]]:
    """An app with a saved chat of `messages` messages open and drawn."""
    chat = saved_chat(messages)
    app = PhasechatApp(backend=backend or ScriptedBackend())
    async with app.run_test(size=(100, 40)) as pilot:
        log = await opened(pilot, app, chat)
        await pilot.pause(0.3)
        yield pilot, app, log


def mounted(log: ChatLog) -> list[str]:
    return [v.message.content for v in log.query_children(MessageView)]


def on_screen(log: ChatLog, view: MessageView) -> bool:
    return bool(view.region) and bool(view.region.intersection(log.region))


async def test_a_5000_message_chat_mounts_its_newest_messages_only() -> None:
    async with long_chat(5000) as (pilot, app, log):
        views = list(log.query_children(MessageView))
        # The newest FIRST_VIEWS (no more come unasked: the view is at its end, far from
        # the top), the newest on screen, the oldest mounted above it.
        assert len(views) == FIRST_VIEWS
        assert mounted(log)[-2:] == ["question 4998", "answer 4999"]
        assert log.unmounted == 5000 - FIRST_VIEWS
        assert on_screen(log, views[-1])
        assert not on_screen(log, views[0])
        # The branch drawn is still the whole chat, mounted or not.
        assert log.drawn_messages() == shown_messages(app.turns.conversation)
        assert not app.query_one("#welcome").display  # a chat with answers: no first screen
        # Home (from a message): a window at the chat's start; End: back at its end.
        await pilot.press("ctrl+up", "home")
        await wait_for(pilot, lambda: mounted(log)[0] == "question 0")
        await pilot.pause(0.3)
        views = list(log.query_children(MessageView))
        assert on_screen(log, views[0]) and len(views) <= MAX_VIEWS
        assert log.drawn_messages() == shown_messages(app.turns.conversation)
        await pilot.press("end")
        await wait_for(pilot, lambda: mounted(log)[-1] == "answer 4999")
        await pilot.pause(0.3)
        views = list(log.query_children(MessageView))
        assert on_screen(log, views[-1]) and len(views) <= MAX_VIEWS
        assert app.focused is views[-1]


async def test_scrolling_to_the_top_brings_every_older_message_in_order() -> None:
    async with long_chat(240) as (pilot, _app, log):
        first = next(iter(log.query_children(MessageView)))
        left = log.unmounted
        assert left == 240 - FIRST_VIEWS
        log.scroll_home(animate=False)
        await wait_for(pilot, lambda: log.unmounted < left)
        # the view keeps its place below the batch: wait for that scroll, not a time (at
        # load 22 on 2 xdist workers, 0.5 s after the mount it had not come yet)
        await wait_for(pilot, lambda: log.scroll_y > 0)
        await pilot.pause(0.5)
        # The older batch went in above what the user was looking at: the message that
        # was first stays on screen, the one mounted just above it is above the screen.
        views = list(log.query_children(MessageView))
        assert views.index(first) > 0
        assert on_screen(log, first)
        assert not on_screen(log, views[views.index(first) - 1])
        # Home again and again: the first message comes, the window stays MAX_VIEWS.
        while mounted(log)[0] != "question 0":
            log.scroll_home(animate=False)
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        log.scroll_home(animate=False)
        await pilot.pause(0.1)
        views = list(log.query_children(MessageView))
        assert on_screen(log, views[0])
        assert len(views) <= MAX_VIEWS
        everything = [f"question {i}" if i % 2 == 0 else f"answer {i}" for i in range(240)]
        assert mounted(log) == everything[: len(views)]  # in order, each once
        assert [m.content for m in log.drawn_messages()] == everything
        # End again and again: back to the newest, which new text keeps in view.
        while mounted(log)[-1] != "answer 239":
            log.scroll_end(animate=False)
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        log.scroll_end(animate=False)
        await pilot.pause(0.1)
        assert on_screen(log, list(log.query_children(MessageView))[-1])
        assert len(log.query_children(MessageView)) <= MAX_VIEWS
        assert [m.content for m in log.drawn_messages()] == everything


async def test_a_retry_in_a_long_chat_keeps_the_older_messages_waiting() -> None:
    async with long_chat(300, ScriptedBackend(text="a new answer")) as (pilot, app, log):
        left = log.unmounted
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        await pilot.pause(0.3)
        views = list(log.query_children(MessageView))
        assert views[-1].message.content.strip() == "a new answer"
        assert views[-1].branch == (2, 2)
        assert log.unmounted == left  # only the answer was drawn again
        assert log.drawn_messages() == shown_messages(app.turns.conversation)
        await pilot.press("ctrl+up", "left")  # back to the old answer, ‹1/2›
        await pilot.pause(0.3)
        assert mounted(log)[-1] == "answer 299"
        assert log.unmounted == left


class Held(ScriptedBackend):
    """Streams "the start ", waits for `go`, then "and the end"."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield TextDelta("the start ")
        await self.go.wait()
        yield TextDelta("and the end")
        yield Finished("stop")


async def test_scrolling_up_while_an_answer_streams_never_unmounts_it() -> None:
    backend = Held()
    async with long_chat(300, backend) as (pilot, app, log):
        views = len(mounted(log))
        app.chat.send("one more")
        await wait_for(pilot, lambda: app.chat.generating and len(mounted(log)) == views + 2)
        live = list(log.query_children(MessageView))[-1]
        oldest = mounted(log)[0]
        # Home again and again, far enough that the window would drop its newest.
        while mounted(log).index(oldest) < MAX_VIEWS:
            log.scroll_home(animate=False)
            await pilot.pause(0.1)
        assert live.is_attached and live.message.status == "streaming"
        log.scroll_end(animate=False)  # back to it: nothing more is mounted or dropped
        await pilot.pause(0.5)
        backend.go.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        assert live.is_attached
        assert live.markdown.source == "the start and the end"
        assert log.drawn_messages() == shown_messages(app.turns.conversation)


def test_a_long_prompt_is_drawn_clipped_with_its_notice() -> None:
    text = "".join(f"prompt line {i:06d}\n" for i in range(60_000))  # 1.2 MB
    section = Section("history", 0, 300_000, None, None, None)
    anatomy = Anatomy((section,), "estimate", None, text, ((0, len(text), 0),))
    body = PromptView(anatomy, "the prompt of answer 1").body()
    plain = body.plain
    assert len(plain) < clip.VIEW_CHARS + 200
    assert "prompt line 000000" in plain and "prompt line 059999" in plain
    assert "prompt line 030000" not in plain
    left = len(marked_text(anatomy)) - clip.VIEW_CHARS  # the text and its section's label
    assert f"⟦… {left:,} characters not drawn here" in plain


def test_a_long_timeline_is_drawn_clipped_with_its_notice() -> None:
    n = 100_000
    texts = [f"line {i:06d}\n" for i in range(n)]  # 12 characters each
    no = [False] * n
    timeline = Timeline(texts, [10.0] * n, [0] * n, no, no, [1] * n, (10.0,), 10.0, True, False)
    plain = shaded_text(timeline).plain
    assert len(plain) < clip.VIEW_CHARS + 200
    assert plain.startswith("line 000000") and plain.endswith("line 099999\n")
    # whole events only: 4,000 // 12 = 333 from the start, 12,000 // 12 = 1,000 at the end
    left = 100_000 - 333 - 1_000
    assert f"⟦… {left * 12:,} characters ({left:,} token events) not drawn" in plain
    assert "line 000332\n" in plain and "line 000333" not in plain
    assert "line 099000" in plain and "line 098999" not in plain


def test_a_short_text_is_drawn_whole() -> None:
    assert clip.left_out(clip.VIEW_CHARS) is None
    assert clip.left_out(clip.VIEW_CHARS + 1) == (4_000, 4_001)
    assert clip.items_left_out([5] * 8, limit=40) is None
    assert clip.items_left_out([5] * 9, limit=40) == (2, 3)  # 10 // 5 first, 30 // 5 last


async def test_c_on_a_long_answer_compares_its_start_and_end() -> None:
    with ChatStore() as store:
        chat = store.create_chat("two long answers", "")
        question = store.add_message(chat, ChatMessage("user", "a long one, please"), None)
        for side in "AB":
            text = "".join(f"{side} line {i:05d}\n" for i in range(8000))  # 104 KB
            answer = ChatMessage("assistant", text, "scripted", "m", metrics=METRICS)
            store.add_message(chat, answer, question)
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=(100, 40)) as pilot:
        log = await opened(pilot, app, chat)
        views = list(log.query_children(MessageView))
        assert views[-1].branch == (2, 2)
        views[-1].focus()
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.pause(0.3)
        for n, side in enumerate("AB"):
            plain = str(app.screen.query_one(f"#compare-text-{n}", Static).render())
            assert f"{side} line 00000" in plain and f"{side} line 07999" in plain
            assert f"{side} line 04000" not in plain
            assert f"⟦… {8000 * 13 - clip.VIEW_CHARS:,} characters not drawn here" in plain
