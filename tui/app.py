"""The phasechat Textual app.

Data flows one way: the app drives a `ChatSession` (chat/), which wraps a backend's event
stream in the telemetry recorder. The generation worker only consumes events; a timer
at REFRESH_HZ moves new text into the chat and redraws the telemetry panel from the
recorder's state, so the UI's cost per second is fixed whatever the token rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState

from backends.base import Backend
from chat.config import Config
from chat.conversation import Conversation
from chat.profiles import BackendSpec, make_backend
from chat.session import ChatSession, Exchange, InputError, Settings
from chat.store import ChatStore
from telemetry.forecast import Forecast
from telemetry.live import snapshot
from telemetry.metrics import metrics_from_dict
from telemetry.tokens import estimate_text
from themes import VARIABLE_DEFAULTS
from tui.panel import draft_forecast
from tui.session_features import SessionFeatures
from tui.telemetry_view import (
    answer_footer,
    engine_line,
    fmt,
    forecast_line,
    live_content,
    trim_line,
)
from tui.widgets import LivePanel, MessageView, PromptInput

REFRESH_HZ = 15
FORECAST_EVERY_S = 0.25
YIELD_EVERY_NS = 4_000_000


class PhasechatApp(SessionFeatures):
    """Chat with a local or remote model and watch prefill and decode live."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "phasechat"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+r", "retry", "Retry", id="retry"),
        Binding("ctrl+b", "switch_backend", "Backend", id="switch-backend"),
        Binding("f2", "history", "History", id="history"),
        Binding("f3", "chats", "Chats", id="chats"),
        Binding("f4", "settings", "Settings", id="settings"),
        Binding("ctrl+t", "toggle_telemetry", "Telemetry", id="toggle-telemetry"),
        Binding("ctrl+l", "focus_prompt", "Prompt", id="focus-prompt", show=False),
    ]

    def __init__(
        self,
        spec: BackendSpec | None = None,
        settings: Settings | None = None,
        backend: Backend | None = None,
        profiles: list[BackendSpec] | None = None,
        config: Config | None = None,
    ) -> None:
        super().__init__()
        self.config = config or Config()
        self.store: ChatStore | None = None  # opened on mount; None if it cannot be
        spec = spec or BackendSpec()
        active = backend or make_backend(spec)
        self.session = ChatSession(active, settings)
        # Backends handed in are closed by their owner; the ones we make, by us.
        self._owned: set[str] = set() if backend is not None else {spec.name}
        self.profiles = {p.name: p for p in [spec, *(profiles or [])]}
        self.backends: dict[str, Backend] = {spec.name: active}
        self._streaming: tuple[Exchange, MessageView] | None = None
        self._sending = False
        self._started = False
        self._pending_text = ""
        self._marked = 0  # messages shown as summarized
        self._forecast: tuple[str, Forecast | None, float] = ("", None, 0.0)
        self._predicted: dict[int, Forecast] = {}
        self.last_error = ""

    # -- layout ----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")
        yield LivePanel(id="telemetry")
        yield PromptInput(id="prompt", show_line_numbers=False)
        yield Static(id="status")
        yield Footer()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        self._setup_themes()
        self._open_store()
        self.apply_trim_config()
        self.query_one("#log", VerticalScroll).anchor()
        self.query_one("#prompt", PromptInput).focus()
        self.set_interval(1 / REFRESH_HZ, self.refresh_live)
        self.load_backend()
        self.refresh_status()

    @property
    def generating(self) -> bool:
        return self._sending or self._streaming is not None

    # -- backend ---------------------------------------------------------------------
    @work(exclusive=True, group="load")
    async def load_backend(self) -> None:
        backend = self.backend
        self.refresh_status()
        if not backend.exact_token_counts:
            # Load the tiktoken encoding off the UI thread now, not on the first send.
            await asyncio.to_thread(estimate_text, "warm up")
        await backend.start()
        self.refresh_status()
        if backend.state == "failed":
            self.notify(backend.state_detail, title="backend failed", severity="error")

    async def switch_to(self, name: str) -> None:
        """Answer with profile `name` from now on; a streaming answer is stopped first
        (its partial text is kept) and the conversation carries over."""
        if name == self.backend.name or name not in self.profiles:
            return
        await self.stop_and_wait()
        backend = self.backends.get(name)
        if backend is None:
            backend = self.backends[name] = make_backend(self.profiles[name])
            self._owned.add(name)
        self.session.switch_backend(backend)
        self.notify(f"now answering with {name} · {backend.model}")
        if backend.state in ("idle", "failed"):
            self.load_backend()
        self.refresh_status()

    async def show_conversation(self, conversation: Conversation) -> None:
        """Replace the chat on screen (and in the session) with a saved conversation."""
        await self.stop_and_wait()
        self.session.conversation = conversation
        log = self.query_one("#log", VerticalScroll)
        await log.remove_children()
        views = [MessageView(m) for m in conversation.messages]
        await log.mount_all(views)
        for view in views:
            m = view.message
            if m.role == "assistant" and m.metrics:
                footer = answer_footer(metrics_from_dict(m.metrics))
                if m.error:
                    footer = Content.assemble(footer, (f"\n{m.error}", "$error"))
                view.set_footer(footer)
        log.anchor()

    # -- sending ---------------------------------------------------------------------
    @on(PromptInput.Submitted)
    def submit(self, event: PromptInput.Submitted) -> None:
        self.send(event.text)

    @on(PromptInput.StopRequested)
    def stop_requested(self) -> None:
        self.action_stop()

    def send(self, text: str) -> bool:
        """Send `text` as the next user turn; False (with a message) when it can't be."""
        if self.generating:
            self.notify("still answering: press Esc to stop it first", severity="warning")
            return False
        if not text.strip():
            self.notify("empty prompt: type a message first", severity="warning")
            return False
        self.query_one("#prompt", PromptInput).clear()
        self._ensure_chat()
        self._sending = True  # `generating` from now, not from when the worker starts
        self._started = False
        self._pending_text = text
        self.generate(text)
        return True

    @work(exclusive=True, group="generate")
    async def generate(self, prompt: str) -> None:
        """Consume the session's event stream; the refresh timer does the drawing."""
        self._started = True
        predicted = self._forecast[1] if self._forecast[0] == prompt else None
        try:
            exchange = self.session.begin(prompt)
        except InputError as exc:
            self.notify(str(exc), severity="warning")
            self._sending = False
            return
        if predicted is not None:
            self._predicted[exchange.answer.id] = predicted
        stream = self.session.run(exchange)
        try:
            await self._mount_exchange(exchange)
            # A fast stream can deliver thousands of buffered events without the loop
            # ever suspending; give the UI a turn every few milliseconds.
            clock = time.perf_counter_ns
            turn = clock() + YIELD_EVERY_NS
            async for _event in stream:
                if clock() > turn:
                    await asyncio.sleep(0)
                    turn = clock() + YIELD_EVERY_NS
        finally:
            try:
                await stream.aclose()
                self.session.abandon(exchange)  # cancelled before it started: still finished
                await self._finish_exchange()
            finally:
                self._sending = False
                with contextlib.suppress(NoMatches):
                    self.refresh_status()

    async def _mount_exchange(self, exchange: Exchange) -> None:
        log = self.query_one("#log", VerticalScroll)
        answer = MessageView(exchange.answer)
        await log.mount_all([MessageView(exchange.user), answer])
        answer.start_stream()
        self._streaming = (exchange, answer)
        self.refresh_status()

    async def _finish_exchange(self) -> None:
        if self._streaming is None:
            return
        exchange, view = self._streaming
        try:
            await self.refresh_live()
            if exchange.metrics is not None:
                footer = answer_footer(
                    exchange.metrics, self._predicted.get(exchange.answer.id), exchange.trim_note
                )
                if exchange.answer.error:
                    footer = Content.assemble(footer, (f"\n{exchange.answer.error}", "$error"))
                    self.last_error = exchange.answer.error
                    self.notify(exchange.answer.error, title="answer failed", severity="error")
                await view.finish(footer)
        except NoMatches:
            pass  # the app is shutting down: the answer itself was saved by the session
        finally:
            # Only now: `generating` turns false once the answer is final on screen.
            self._streaming = None
            with contextlib.suppress(NoMatches):  # the app may be shutting down
                self.refresh_status()

    # -- the refresh timer -----------------------------------------------------------
    async def refresh_live(self) -> None:
        """Move new text into the streaming message and redraw the panel (REFRESH_HZ)."""
        try:
            panel = self.query_one("#telemetry", LivePanel)
        except NoMatches:  # the timer can fire once more while the app shuts down
            return
        if self._streaming is not None:
            exchange, view = self._streaming
            text = exchange.trace.text
            if len(text) > view.shown:
                await view.append(text[view.shown :])
                view.shown = len(text)
        elif self.session.exchanges:
            exchange = self.session.exchanges[-1]
        else:
            panel.show(Content.assemble(("no answers yet   ", "dim"), self._forecast_content()))
            return
        trace = exchange.trace
        kv = (
            (trace.kv.used_tokens, trace.kv.capacity_tokens, trace.kv.used_bytes)
            if trace.kv
            else None
        )
        parts = [live_content(snapshot(trace, time.perf_counter_ns()), kv)]
        if not self.generating:
            if exchange.metrics is not None:
                parts.append(engine_line(exchange.metrics))
            parts.append(self._forecast_content())
            self._mark_summarized()
        if self.session.trimmer.summaries or self.session.trimmer.pending:
            parts.append(trim_line(self.session.trim_stats()))
        panel.show(Content("\n").join(p for p in parts if p))

    def _mark_summarized(self) -> None:
        """Dim the messages the trimmer has replaced by a summary, when that changes."""
        trimmer = self.session.trimmer
        covered = trimmer.covered if trimmer.enabled else frozenset()
        if len(covered) == self._marked:
            return
        self._marked = len(covered)
        for view in self.query(MessageView):
            view.mark_summarized(view.message.id in covered)

    def _forecast_content(self) -> Content:
        """The draft's forecast, recomputed at most every FORECAST_EVERY_S when it changed."""
        try:
            draft = self.query_one("#prompt", PromptInput).text
        except NoMatches:
            return Content("")
        text, _, at = self._forecast
        now = time.monotonic()
        if draft != text and now - at >= FORECAST_EVERY_S:
            self._forecast = (draft, draft_forecast(self.session, draft), now)
        current = self._forecast[1]
        return forecast_line(current) if current is not None else Content("")

    def refresh_status(self) -> None:
        b = self.backend
        state = "streaming" if self.generating else b.state
        last = self.session.exchanges[-1].metrics if self.session.exchanges else None
        tail = ""
        if last is not None:
            tail = f"  ·  last: TTFT {fmt(last.ttft_ms, ' ms', 0)}, {fmt(last.decode_tok_s)} tok/s"
        style = {"failed": "$error", "loading": "$warning", "streaming": "$accent"}.get(
            state, "$success"
        )
        self.query_one("#status", Static).update(
            Content.assemble(
                (f" {b.name}", "bold"),
                f" · {b.model} · ",
                (state, style),
                (f" · {b.state_detail}" if b.state == "failed" else "", "$error"),
                tail,
            )
        )

    # -- actions ---------------------------------------------------------------------
    async def stop_and_wait(self) -> None:
        """Stop a streaming answer and return once it is saved and final on screen."""
        running = [w for w in self.workers if w.group == "generate" and not w.is_finished]
        self.action_stop()
        for worker in running:
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await worker.wait()

    def action_stop(self) -> None:
        """Stop the answer being generated; its partial text is kept."""
        if self.generating:
            self.workers.cancel_group(self, "generate")
            if self._sending and not self._started:
                # Cancelled before it ran: no finally will reset us, and the text the
                # user typed goes back into the prompt box.
                self._sending = False
                prompt = self.query_one("#prompt", PromptInput)
                if not prompt.text:
                    prompt.text = self._pending_text
                self.refresh_status()

    def action_retry(self) -> None:
        """Send the last user message again."""
        users = [m for m in self.session.conversation.messages if m.role == "user"]
        if users and not self.generating:
            self.send(users[-1].content)

    def action_toggle_telemetry(self) -> None:
        panel = self.query_one("#telemetry", LivePanel)
        panel.display = not panel.display

    def action_focus_prompt(self) -> None:
        self.query_one("#prompt", PromptInput).focus()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Stop answer", "Stop the answer being generated", self.action_stop)
        yield SystemCommand("Retry", "Send the last message again", self.action_retry)
        yield SystemCommand(
            "Switch backend", "Answer with another model or endpoint", self.action_switch_backend
        )
        yield SystemCommand(
            "Request history", "Every answer's metrics; export JSONL/CSV", self.action_history
        )
        yield SystemCommand("Chats", "Open, search, rename, delete, export", self.action_chats)
        yield SystemCommand("New chat", "Start an empty chat", self.action_new_chat)
        yield SystemCommand(
            "Toggle history trimming", "Summarize old turns to bound prefill", self.toggle_trimming
        )
        yield SystemCommand(
            "Engine settings", "System prompt, temperature, max tokens, stop", self.action_settings
        )
        yield SystemCommand(
            "Toggle telemetry",
            "Show or hide the live telemetry panel",
            self.action_toggle_telemetry,
        )

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """One place for worker failures: say what broke, keep the app running."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.last_error = f"{type(error).__name__}: {error}"
            self.notify(self.last_error, title="internal error", severity="error")
            self.refresh_status()

    async def on_unmount(self) -> None:
        running = [w for w in self.workers if w.group == "generate" and not w.is_finished]
        self.workers.cancel_all()
        for worker in running:  # let a cancelled answer save its final state first
            with contextlib.suppress(WorkerCancelled, WorkerFailed, TimeoutError):
                await asyncio.wait_for(worker.wait(), 5)
        for name in self._owned:
            await self.backends[name].aclose()
        if self.store is not None:
            self.store.close()
