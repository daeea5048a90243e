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
from textual.message_pump import MessagePump
from textual.timer import Timer
from textual.widgets import TextArea

from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.text import visible_controls
from phasechat.chat.turns import Exchange
from phasechat.tui.widgets.chat_widgets import MessageView
from phasechat.tui.widgets.markdown_view import SHARED_STEP, STREAM_STEP
from phasechat.tui.widgets.telemetry_view import answer_footer, thinking_title

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
        self, owner: MessagePump, refresh: Callable[[], Awaitable[None]], hz: int, cursor: TextArea
    ) -> None:
        """Call `refresh` `hz` times a second, or SHARED_HZ while `shared`, on `owner`'s
        timers (the chat screen's); `cursor` blinks unless `shared`."""
        self._timers = (
            owner.set_interval(1 / hz, refresh),
            owner.set_interval(1 / SHARED_HZ, refresh, pause=True),
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


#: A chat mounts a window of its messages, at first its newest this many (more than a
#: tall terminal shows): every message mounted is laid out again at every layout pass
#: (~0.5 ms each on a 2-core machine), and mounting 5,000 at once froze the UI for a
#: minute (issue 38, bench/long_chat.py).
FIRST_VIEWS = 25
#: Messages are mounted this many at a time at the window's edge the user scrolls to.
BATCH = 10
#: The window never holds more than this many (beyond it, those farthest from what the
#: screen shows are unmounted), so a layout pass costs the same at any place in the chat.
MAX_VIEWS = 50

_Drawn = tuple[ChatMessage, tuple[int, int]]  # a message and its (place, siblings)


class ChatLog(VerticalScroll):
    """The messages of the conversation, oldest first, anchored to the newest.

    Only a window of the branch is mounted: its newest messages at first (FIRST_VIEWS);
    scrolling near the window's top or bottom mounts the next BATCH there, and unmounts
    those farthest away beyond MAX_VIEWS, so a long chat opens at once and each key is
    answered between batches wherever the user reads.
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._marked = 0  # messages shown as summarized
        self._covered: frozenset[int] = frozenset()  # their ids
        #: The branch's messages above and below the window, not mounted (oldest first).
        self._older: list[_Drawn] = []
        self._newer: list[_Drawn] = []
        #: The answer streaming into the window: never unmounted (the app draws into it).
        self._live: MessageView | None = None
        self._conversation: Conversation | None = None  # the one shown last
        self._loading = False  # a batch is on its way
        #: One change of the views at a time: a batch mounted while a new answer is
        #: drawn would interleave with it.
        self._changing = asyncio.Lock()

    @property
    def unmounted(self) -> int:
        """How many of the branch's messages are not mounted (above and below)."""
        return len(self._older) + len(self._newer)

    def drawn_messages(self) -> list[ChatMessage]:
        """The messages of the branch drawn, mounted or not, oldest first."""
        views = [view.message for view in self.query_children(MessageView)]
        return [m for m, _ in self._older] + views + [m for m, _ in self._newer]

    def on_mount(self) -> None:
        # What start-up made lives as long as the app: out of the collector's scans from
        # the first frame on, so the first `settle_heap` walks one turn (11 ms after a
        # 20k-token answer), not the whole heap (79 ms). Not collected first: a pause
        # then would delay the first keys, and import-time garbage is small.
        self.call_after_refresh(gc.freeze)

    async def show(self, conversation: Conversation) -> None:
        """Replace what is shown with `conversation` (a saved chat, or a new one)."""
        gc.unfreeze()  # the old chat's widgets may be frozen (settle_heap): let them go
        async with self._changing:
            await self.remove_children()
            self._older, self._newer, self._live = [], [], None
        self._marked = 0
        await self.show_path(conversation)

    async def show_path(
        self,
        conversation: Conversation,
        streaming: ChatMessage | None = None,
        step: int = 1,
        reveal: ChatMessage | None = None,
    ) -> MessageView | None:
        """Show the branch `conversation` shows now: the views it shares with what is
        on screen stay, the rest is drawn again (after an edit, a retry or a switch to a
        sibling, only what follows the fork). `streaming`: the answer about to stream,
        which grows `step` lines at a time; returns its view. Of many new messages only
        the newest FIRST_VIEWS are mounted; with `reveal`, the window starts there if
        it is older."""
        async with self._changing:
            self._conversation = conversation
            wanted = shown_messages(conversation)
            branches = [conversation.branch_of(m) for m in wanted]
            views = list(self.query_children(MessageView))
            drawn = [*self._older, *((v.message, v.branch) for v in views), *self._newer]
            keep = 0
            for (message, branch), want, wanted_branch in zip(
                drawn, wanted, branches, strict=False
            ):
                if message is not want or branch != wanted_branch:
                    break
                keep += 1
            lo, hi = max(0, len(wanted) - FIRST_VIEWS), len(wanted)
            at = next((i for i, m in enumerate(wanted) if m is reveal), None)
            if at is not None and at < lo:
                lo, hi = at, min(len(wanted), at + FIRST_VIEWS)
            mounted_from = len(self._older)
            if not self._newer and hi == len(wanted) and mounted_from <= keep and lo <= keep:
                # The window goes on from what is mounted: only what follows the fork.
                gone = views[keep - mounted_from :]
                lo = mounted_from
                first_new = keep
            else:  # elsewhere in the chat: a window of its own
                gone, first_new = views, lo
            if gone:
                await self.remove_children(gone)
            self._older = list(zip(wanted[:lo], branches[:lo], strict=True))
            self._newer = list(zip(wanted[hi:], branches[hi:], strict=True))
            new = [
                MessageView(m, step if m is streaming else 1, branches[i])
                for i, m in enumerate(wanted[first_new:hi], first_new)
            ]
            if new:
                await self.mount_all(new)
            self._dress(new, streaming)
            live = next((v for v in new if v.message is streaming), None)
            if streaming is not None:
                self._live = live
        self.anchor(not self._newer)
        self.call_after_refresh(self._fill)
        return live

    def finished(self) -> None:
        """The streaming answer is final on screen: it may be unmounted like the rest."""
        self._live = None

    def _dress(self, views: list[MessageView], streaming: ChatMessage | None = None) -> None:
        """Footers and summary marks of views just mounted."""
        for view in views:
            m = view.message
            if m.role == "assistant" and m.metrics is not None and m is not streaming:
                view.set_footer(footer_of(m, answer_footer(m.metrics)))
            if m.id in self._covered:
                view.mark_summarized(True)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._fill()

    def _fill(self) -> None:
        """Mount a batch where the view is within a screen of the window's top or
        bottom and the branch has more there (a chat shorter than the screen: at once)."""
        if self._loading or not self.is_attached:
            return
        height = self.size.height
        up = bool(self._older) and self.scroll_y < height
        down = bool(self._newer) and self.scroll_y > self.max_scroll_y - height
        if up or down:
            self._loading = True
            self.run_worker(self._mount_batch(up), group="chat-window")
        elif not self._newer and not self.is_anchored and self.scroll_y >= self.max_scroll_y:
            self.anchor()  # back at the chat's end: new text keeps it in view again

    async def _mount_batch(self, up: bool) -> None:
        """Mount the next BATCH above the window (`up`) or below it, keeping what the
        user sees where it is; then unmount beyond MAX_VIEWS, farthest first."""
        kept: MessageView | None = None  # the view whose place on screen is kept
        shift = 0  # ... or the lines to scroll by
        try:
            async with self._changing:
                views = list(self.query_children(MessageView))
                at_end = self.scroll_y >= self.max_scroll_y and not self._newer
                if up:
                    batch = self._older[-BATCH:]
                    del self._older[-BATCH:]
                else:
                    batch = self._newer[:BATCH]
                    del self._newer[:BATCH]
                new = [MessageView(m, 1, branch) for m, branch in batch]
                await self.mount_all(new, before=views[0] if up and views else None)
                self._dress(new)
                extra = max(0, len(views) + len(new) - MAX_VIEWS)
                if up:  # mounted above the first view: it must stay where it was
                    kept = views[0] if views else None
                    # the newest go, unless one of them is the answer streaming
                    gone = views[len(views) - extra :] if extra else []
                    if self._live in gone or self.app.focused in gone:
                        gone = []  # kept: the answer streaming, the message focused
                    self._newer[:0] = [(v.message, v.branch) for v in gone]
                else:  # the oldest go: the view after them moves up by their height
                    gone = views[:extra]
                    if self.app.focused in gone:
                        gone = []
                    if gone:
                        shift = -views[extra].virtual_region.y if extra < len(views) else 0
                    self._older += [(v.message, v.branch) for v in gone]
                if gone:
                    await self.remove_children(gone)
        finally:
            self._loading = False
        if at_end:  # anchored to the chat's end: that holds it in place
            self.call_after_refresh(self._fill)
        else:
            self.call_after_refresh(self._keep_place, kept, shift)

    def _keep_place(self, kept: MessageView | None, shift: int) -> None:
        """Scroll by what went in above `kept` (now its offset: it was first), or by
        `shift`."""
        moved = kept.virtual_region.y if kept is not None else shift
        if moved:
            self.scroll_to(y=self.scroll_y + moved, animate=False)
        self._fill()

    def action_scroll_home(self) -> None:
        """Home: the chat's first message, however far the window is from it (a window
        of its own there, not a batch at a time)."""
        if self._older and self._conversation is not None and self._live is None:
            self.run_worker(self._window_at_start(self._conversation), group="chat-window")
        else:
            super().action_scroll_home()

    def action_scroll_end(self) -> None:
        """End: the chat's newest message, the window back at the chat's end."""
        if self._newer and self._conversation is not None:
            self.run_worker(self._focus_newest(self._conversation), group="chat-window")
        else:
            super().action_scroll_end()

    async def _window_at_start(self, conversation: Conversation) -> None:
        wanted = shown_messages(conversation)
        await self.show_path(conversation, reveal=wanted[0] if wanted else None)
        self.call_after_refresh(self.scroll_home, animate=False)

    def focus_message(self, message_id: int | None) -> bool:
        """Focus message `message_id` (None: the newest) and scroll to it; False if it
        is not mounted (the newest: the window goes back to the chat's end for it)."""
        if message_id is None and self._newer and self._conversation is not None:
            self.run_worker(self._focus_newest(self._conversation))
            return True
        views = list(self.query_children(MessageView))
        if message_id is not None:
            views = [v for v in views if v.message.id == message_id]
        if not views:
            return False
        views[-1].focus()
        views[-1].scroll_visible()
        return True

    async def _focus_newest(self, conversation: Conversation) -> None:
        await self.show_path(conversation)
        self.focus_message(None)

    def toggle_thinking(self) -> bool:
        """Fold or unfold the newest answer's thinking; False when no answer has any."""
        return any(view.toggle_thinking() for view in reversed(self.query(MessageView)))

    def mark_summarized(self, covered: frozenset[int]) -> None:
        """Dim the messages a history summary replaces, when that set changes."""
        if len(covered) == self._marked:
            return
        self._marked, self._covered = len(covered), covered
        for view in self.query(MessageView):
            view.mark_summarized(view.message.id in covered)
