"""The scrolling chat: one `MessageView` per message, answers streamed into them."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

from textual.app import App
from textual.containers import VerticalScroll
from textual.content import Content
from textual.timer import Timer
from textual.widgets import TextArea

from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.text import visible_controls
from phasechat.chat.turns import Exchange
from phasechat.tui.markdown_view import SHARED_STEP, STREAM_STEP
from phasechat.tui.telemetry_view import answer_footer, thinking_title
from phasechat.tui.widgets import MessageView

#: While an engine that shares this machine's CPU or this process generates (a local
#: model, GPU or not: `Backend.shares_cpu`), every frame the UI draws takes about
#: 5 ms of a core from it (bench/ui_cost.py): the answer and the panel are drawn at this
#: rate instead of the app's REFRESH_HZ (issue 13: the TUI must not slow the engine it
#: measures).
SHARED_HZ = 5
#: ... and the panel's figures at this rate (a panel drawn with every frame was a fifth
#: of the UI's CPU during a local decode; figures are not read 5 times a second).
SHARED_PANEL_HZ = 2


class Pace:
    """How a streaming answer is drawn. While an engine that shares this machine's CPU or
    this process generates (`Backend.shares_cpu`), all the UI does takes a core or the
    interpreter lock from it, so: the refresh timer
    wakes SHARED_HZ times a second instead of the app's REFRESH_HZ, the answer's tail
    grows SHARED_STEP lines at a time, the engine hands tokens over once per draw
    (`GenerationRequest.batch_s`), the panel is redrawn SHARED_PANEL_HZ times a second,
    and the prompt's cursor does not blink (two frames a second of its own). Otherwise
    every refresh draws, STREAM_STEP lines at a time, tokens as they come."""

    def __init__(self) -> None:
        self._draws, self._panel = _Every(SHARED_HZ), _Every(SHARED_PANEL_HZ)
        self.shared = False
        self._timers: tuple[Timer, Timer] | None = None  # (REFRESH_HZ, SHARED_HZ)
        self._cursor: TextArea | None = None

    def drive(
        self, app: App[Any], refresh: Callable[[], Awaitable[None]], hz: int, cursor: TextArea
    ) -> None:
        """Call `refresh` `hz` times a second, or SHARED_HZ while `shared`; `cursor`
        blinks unless `shared`."""
        self._timers = (
            app.set_interval(1 / hz, refresh),
            app.set_interval(1 / SHARED_HZ, refresh, pause=True),
        )
        self._cursor = cursor

    def begin(self, shared: bool) -> None:
        """An answer starts (`shared`: `Backend.shares_cpu`); `end` ends it."""
        self.shared = shared
        if self._timers is not None:
            every, slow = self._timers
            (every.pause if shared else every.resume)()
            (slow.resume if shared else slow.pause)()
        if self._cursor is not None:
            self._cursor.cursor_blink = not shared

    def end(self) -> None:
        self.begin(False)

    @property
    def step(self) -> int:
        return SHARED_STEP if self.shared else STREAM_STEP

    @property
    def batch_s(self) -> float | None:
        return 1 / SHARED_HZ if self.shared else None

    def due(self, force: bool = False) -> bool:
        """Whether to draw now (at most SHARED_HZ a second while shared; if so,
        counted as drawn)."""
        return not self.shared or force or self._draws.now()

    def panel_due(self) -> bool:
        """Whether to redraw the panel now (at most SHARED_PANEL_HZ a second while
        shared; if so, counted as drawn)."""
        return not self.shared or self._panel.now()


class _Every:
    """At most `hz` times a second (a tenth early counts: timers jitter)."""

    def __init__(self, hz: float) -> None:
        self.hz = hz
        self._at = 0.0

    def now(self) -> bool:
        """Whether it is time (if so, counted as done)."""
        now = time.monotonic()
        if now - self._at < 0.9 / self.hz:
            return False
        self._at = now
        return True


#: At most this much new text is drawn per draw: a stream faster than the UI draws (a
#: server on this machine at full speed) is caught up over several frames, each short
#: enough for a key typed meanwhile (Rich takes ~1 ms per KB). Once the stream has
#: ended, the refresh timer's chain and the finishing worker both draw, so a frame may
#: carry twice this: one draw per frame made the last token 0.6-0.95 s late instead of
#: 0.43-0.58 s, for keys no better (bench/README.md, stop 21).
FRAME_CHARS = 8000


async def draw_answer(exchange: Exchange, view: MessageView, step: int) -> bool:
    """Move up to FRAME_CHARS of the streaming answer's new text (and its thinking) into
    its view, whose tail grows `step` lines at a time (markdown_view.STREAM_STEP);
    True while more is waiting."""
    text = exchange.text
    if len(text) > view.shown:
        # Claimed before the await: the timer and the finishing worker both come here,
        # and must not append the same text twice.
        end = min(len(text), view.shown + FRAME_CHARS)
        new, view.shown = text[view.shown : end], end
        await view.append(new, step)
    view.set_reasoning(exchange.reasoning, thinking_title(exchange.live()))
    return len(text) > view.shown


async def draw_rest(app: App[Any], exchange: Exchange, view: MessageView, step: int) -> None:
    """Draw a finished stream's backlog a frame's worth at a time (keys typed meanwhile
    get their frames between)."""
    while await draw_answer(exchange, view, step):
        await next_frame(app)


async def next_frame(app: App[Any]) -> None:
    """Return once the screen has been drawn (or after 0.25 s)."""
    drawn = asyncio.Event()
    app.call_after_refresh(drawn.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drawn.wait(), 0.25)


def settle_heap(modal_open: bool) -> None:
    """Once an answer is final: collect what this turn left, and move everything alive
    to the permanent generation, where Python's cyclic collector no longer scans it.

    A full collection walks every tracked object, so without this a long chat's
    widgets and segments made every few turns pay a pause that grew with the chat
    (bench.tmux_ui: turns of 110-150 ms with some at 260-330 ms by turn 16). Each call
    scans only what was made since the last one. Not while a modal screen is open (its
    widgets go away soon); `ChatLog.show` unfreezes before it drops a whole chat.
    """
    if not modal_open:
        gc.collect()
        gc.freeze()


def shown_messages(conversation: Conversation) -> list[ChatMessage]:
    """The messages of the branch shown, as drawn: the system prompt first when there is
    one (or another branch has one, so its ‹1/2› can be reached), then the chat."""
    path = conversation.path()
    root = path[0]
    if root.role == "system" and not root.content and len(conversation.siblings(root)) == 1:
        return path[1:]
    return path


def editing_title(message: ChatMessage, conversation: Conversation) -> str:
    """The prompt box's title while it edits `message`."""
    if message.role == "system":
        return (
            "editing the system prompt · Enter: answer the last question with it"
            " (a new branch) · Esc: cancel"
        )
    number = next((i for i, m in enumerate(conversation.questions(), 1) if m is message), 0)
    return f"editing question {number} · Enter: send it as a new branch · Esc: cancel"


def footer_of(message: ChatMessage, footer: Content) -> Content:
    """An answer's footer, with its error (if it failed) on a line of its own."""
    if message.error:
        # The error quotes a server: drawn as inert text.
        return Content.assemble(footer, (f"\n{visible_controls(message.error)}", "$error"))
    return footer


class ChatLog(VerticalScroll):
    """The messages of the conversation, oldest first, anchored to the newest."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._marked = 0  # messages shown as summarized

    def on_mount(self) -> None:
        # What start-up made lives as long as the app: out of the collector's scans from
        # the first frame on, so the first `settle_heap` walks one turn (11 ms after a
        # 20k-token answer), not the whole heap (79 ms). Not collected first: a pause
        # then would delay the first keys, and import-time garbage is small.
        self.call_after_refresh(gc.freeze)

    async def show(self, conversation: Conversation) -> None:
        """Replace what is shown with `conversation` (a saved chat, or a new one)."""
        gc.unfreeze()  # the old chat's widgets may be frozen (settle_heap): let them go
        await self.remove_children()
        self._marked = 0
        await self.show_path(conversation)

    async def show_path(
        self, conversation: Conversation, streaming: ChatMessage | None = None, step: int = 1
    ) -> MessageView | None:
        """Show the branch `conversation` shows now: the views it shares with what is
        on screen stay, the rest is drawn again (after an edit, a retry or a switch to a
        sibling, only what follows the fork). `streaming`: the answer about to stream,
        which grows `step` lines at a time; returns its view."""
        wanted = shown_messages(conversation)
        views = list(self.query_children(MessageView))
        keep = 0
        for view, message in zip(views, wanted, strict=False):
            if view.message is not message or view.branch != conversation.branch_of(message):
                break
            keep += 1
        if views[keep:]:
            await self.remove_children(views[keep:])
        new = [
            MessageView(m, step if m is streaming else 1, conversation.branch_of(m))
            for m in wanted[keep:]
        ]
        if new:
            await self.mount_all(new)
        for view in new:
            m = view.message
            if m.role == "assistant" and m.metrics is not None and m is not streaming:
                view.set_footer(footer_of(m, answer_footer(m.metrics)))
        self.anchor()
        return next((v for v in new if v.message is streaming), None)

    def focus_message(self, message_id: int | None) -> bool:
        """Focus message `message_id` (None: the newest) and scroll to it; False if it
        is not shown."""
        views = list(self.query_children(MessageView))
        if message_id is not None:
            views = [v for v in views if v.message.id == message_id]
        if not views:
            return False
        views[-1].focus()
        views[-1].scroll_visible()
        return True

    def toggle_thinking(self) -> bool:
        """Fold or unfold the newest answer's thinking; False when no answer has any."""
        return any(view.toggle_thinking() for view in reversed(self.query(MessageView)))

    def mark_summarized(self, covered: frozenset[int]) -> None:
        """Dim the messages a history summary replaces, when that set changes."""
        if len(covered) == self._marked:
            return
        self._marked = len(covered)
        for view in self.query(MessageView):
            view.mark_summarized(view.message.id in covered)
