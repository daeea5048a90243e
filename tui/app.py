"""The phasechat Textual app.

Data flows one way: the app drives a `ChatSession` (chat/), which wraps a backend's event
stream in the telemetry recorder. The generation worker only consumes events; a timer
at REFRESH_HZ moves new text into the chat and redraws the telemetry panel from the
recorder's state, so the UI's cost per second is fixed whatever the token rate.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerState

from backends.base import Backend
from chat.profiles import BackendSpec, make_backend
from chat.session import ChatSession, Exchange, InputError, Settings
from telemetry.live import snapshot
from themes import BUILTIN_THEMES, DEFAULT_THEME, VARIABLE_DEFAULTS
from tui.telemetry_view import answer_footer, fmt, live_content
from tui.widgets import MessageView, PromptInput

REFRESH_HZ = 15


class PhasechatApp(App[None]):
    """Chat with a local or remote model and watch prefill and decode live."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "phasechat"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+r", "retry", "Retry", id="retry"),
        Binding("ctrl+t", "toggle_telemetry", "Telemetry", id="toggle-telemetry"),
        Binding("ctrl+l", "focus_prompt", "Prompt", id="focus-prompt", show=False),
    ]

    def __init__(
        self,
        spec: BackendSpec | None = None,
        settings: Settings | None = None,
        backend: Backend | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec or BackendSpec()
        self.session = ChatSession(backend or make_backend(self.spec), settings)
        self._owns_backend = backend is None  # a backend handed in is closed by its owner
        self._views: dict[int, MessageView] = {}
        self._streaming: tuple[Exchange, MessageView] | None = None
        self.last_error = ""

    # -- layout ----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")
        yield Static(id="telemetry")
        yield PromptInput(id="prompt", show_line_numbers=False)
        yield Static(id="status")
        yield Footer()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        for theme in BUILTIN_THEMES:
            self.register_theme(theme)
        self.theme = DEFAULT_THEME
        self.query_one("#log", VerticalScroll).anchor()
        self.query_one("#prompt", PromptInput).focus()
        self.set_interval(1 / REFRESH_HZ, self.refresh_live)
        self.load_backend()
        self.refresh_status()

    @property
    def backend(self) -> Backend:
        return self.session.backend

    @property
    def generating(self) -> bool:
        return self._streaming is not None

    # -- backend ---------------------------------------------------------------------
    @work(exclusive=True, group="load")
    async def load_backend(self) -> None:
        self.refresh_status()
        await self.backend.start()
        self.refresh_status()
        if self.backend.state == "failed":
            self.notify(self.backend.state_detail, title="backend failed", severity="error")

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
        self.generate(text)
        return True

    @work(exclusive=True, group="generate")
    async def generate(self, prompt: str) -> None:
        """Consume the session's event stream; the refresh timer does the drawing."""
        try:
            exchange = self.session.begin(prompt)
        except InputError as exc:
            self.notify(str(exc), severity="warning")
            return
        await self._mount_exchange(exchange)
        stream = self.session.run(exchange)
        try:
            async for _event in stream:
                pass
        finally:
            await stream.aclose()
            await self._finish_exchange()

    async def _mount_exchange(self, exchange: Exchange) -> None:
        log = self.query_one("#log", VerticalScroll)
        user, answer = MessageView(exchange.user), MessageView(exchange.answer)
        await log.mount_all([user, answer])
        answer.start_stream()
        self._views[exchange.user.id] = user
        self._views[exchange.answer.id] = answer
        self._streaming = (exchange, answer)
        self.refresh_status()

    async def _finish_exchange(self) -> None:
        if self._streaming is None:
            return
        exchange, view = self._streaming
        self._streaming = None
        await self.refresh_live()
        if exchange.metrics is not None:
            footer = answer_footer(exchange.metrics)
            if exchange.answer.error:
                footer = Content.assemble(footer, (f"\n{exchange.answer.error}", "$error"))
                self.last_error = exchange.answer.error
                self.notify(exchange.answer.error, title="answer failed", severity="error")
            await view.finish(footer)
        self.refresh_status()

    # -- the refresh timer -----------------------------------------------------------
    async def refresh_live(self) -> None:
        """Move new text into the streaming message and redraw the panel (REFRESH_HZ)."""
        try:
            panel = self.query_one("#telemetry", Static)
        except NoMatches:  # the timer can fire once more while the app shuts down
            return
        exchange = self._streaming[0] if self._streaming else self.session.current
        if exchange is None and self.session.exchanges:
            exchange = self.session.exchanges[-1]
        if exchange is None:
            panel.update(Content.assemble(("no answers yet", "dim")))
            return
        trace = exchange.trace
        if self._streaming is not None:
            view = self._streaming[1]
            text = trace.text
            if len(text) > view.shown:
                await view.append(text[view.shown :])
                view.shown = len(text)
        kv = (
            (trace.kv.used_tokens, trace.kv.capacity_tokens, trace.kv.used_bytes)
            if trace.kv
            else None
        )
        panel.update(live_content(snapshot(trace, time.perf_counter_ns()), kv))

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
    def action_stop(self) -> None:
        """Stop the answer being generated; its partial text is kept."""
        if self.generating:
            self.workers.cancel_group(self, "generate")

    def action_retry(self) -> None:
        """Send the last user message again."""
        users = [m for m in self.session.conversation.messages if m.role == "user"]
        if users and not self.generating:
            self.send(users[-1].content)

    def action_toggle_telemetry(self) -> None:
        panel = self.query_one("#telemetry", Static)
        panel.display = not panel.display

    def action_focus_prompt(self) -> None:
        self.query_one("#prompt", PromptInput).focus()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Stop answer", "Stop the answer being generated", self.action_stop)
        yield SystemCommand("Retry", "Send the last message again", self.action_retry)
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
        self.workers.cancel_all()
        if self._owns_backend:
            await self.backend.aclose()
