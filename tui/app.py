"""The phasechat Textual app: it draws a `Workspace` (chat/workspace.py) and runs its
workers; the state itself (backends, session, store, config) lives there.

Data flows one way: the app drives the workspace's `ChatSession`, which wraps a
backend's event stream in the telemetry recorder. The generation worker only consumes
events; a timer (REFRESH_HZ, slower beside a local engine: chat_log.Pace) moves new
text into the chat and redraws the telemetry panel from the exchange's live figures, so
the UI's cost per second is fixed whatever the token rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState

from phasechat.backends.base import Backend
from phasechat.backends.tokens import estimate_text
from phasechat.chat.config import Config
from phasechat.chat.conversation import Conversation
from phasechat.chat.costs import DraftForecast
from phasechat.chat.profiles import BackendSpec
from phasechat.chat.session import ChatSession, Exchange, InputError
from phasechat.chat.settings import Settings
from phasechat.chat.workspace import Workspace
from phasechat.telemetry.forecast import Forecast
from phasechat.themes import VARIABLE_DEFAULTS
from phasechat.tui import chat_log, dialogs, replay, verdict_view
from phasechat.tui.chat_log import ChatLog, Pace, draw_answer
from phasechat.tui.history_screen import HistoryScreen
from phasechat.tui.markdown_view import RICH_THEME
from phasechat.tui.plain import PlainTextApp
from phasechat.tui.telemetry_view import answer_footer, forecast_line, panel_content, status_content
from phasechat.tui.widgets import LivePanel, MessageView, PromptInput

REFRESH_HZ = 15
YIELD_EVERY_NS = 4_000_000


class PhasechatApp(PlainTextApp):
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
        Binding("f5", "compare", "Compare", id="compare"),
        Binding("ctrl+t", "toggle_telemetry", "Telemetry", id="toggle-telemetry"),
        Binding("ctrl+o", "toggle_thinking", "Thinking", id="toggle-thinking"),
        Binding("ctrl+l", "focus_prompt", "Prompt", id="focus-prompt", show=False),
    ]

    def __init__(
        self,
        spec: BackendSpec | None = None,
        settings: Settings | None = None,
        backend: Backend | None = None,
        profiles: Sequence[BackendSpec] = (),
        config: Config | None = None,
        *,
        workspace: Workspace | None = None,
    ) -> None:
        """Draw `workspace`, or one built from the other arguments (as tests do)."""
        super().__init__()
        self.workspace = workspace or Workspace(
            config or Config(), spec or BackendSpec(), profiles, settings, backend
        )
        self._streaming: tuple[Exchange, MessageView] | None = None
        self._sending = False
        self._started = False
        self._pending_text = ""
        self._forecast = DraftForecast()
        self._pace = Pace()  # how the streaming answer is drawn
        self._predicted: dict[int, Forecast] = {}
        self.last_error = ""

    @property
    def session(self) -> ChatSession:
        return self.workspace.session

    @property
    def backend(self) -> Backend:
        return self.workspace.backend

    @property
    def generating(self) -> bool:
        return self._sending or self._streaming is not None

    # -- layout ----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield ChatLog(id="log")
        yield LivePanel(id="telemetry")
        yield PromptInput(id="prompt", show_line_numbers=False)
        yield Static(id="status")
        yield Footer()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        dialogs.setup_themes(self)
        self.console.push_theme(RICH_THEME)  # inline code readable on light themes too
        for line in self.workspace.open_store():
            failed = self.workspace.store is None
            self.notify(line, severity="error" if failed else "warning")
        dialogs.watch_saves(self)
        self._start_summarizer(self.workspace.configure_trimmer(self.session.trimmer))
        self.query_one(ChatLog).anchor()
        self.query_one(PromptInput).focus()
        self._pace.drive(self, self.refresh_live, REFRESH_HZ, self.query_one(PromptInput))
        self.load_backend()
        self.refresh_status()

    def action_follow_link(self, href: str) -> None:
        """A link clicked in a message (tui/markdown_view.py): see dialogs.open_link."""
        dialogs.open_link(self, href)

    # -- backends --------------------------------------------------------------------
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
            self.notify(
                backend.state_detail, title="backend failed", severity="error", markup=False
            )

    def _start_summarizer(self, backend: Backend | None) -> None:
        if backend is not None:
            self.run_worker(backend.start(), group="load-summarizer")

    async def switch_to(self, name: str) -> None:
        """Answer with profile `name` from now on; a streaming answer is stopped first
        (its partial text is kept) and the conversation carries over."""
        if name == self.backend.name or name not in self.workspace.profiles:
            return
        await self.stop_and_wait()
        backend = self.workspace.switch(name)
        if backend is None:
            return
        self.notify(f"now answering with {name} · {backend.model}", markup=False)
        if backend.state in ("idle", "failed"):
            self.load_backend()
        self.refresh_status()

    async def show_conversation(self, conversation: Conversation) -> None:
        """Replace the chat on screen (and in the session) with `conversation`."""
        await self.stop_and_wait()
        self.session.conversation = conversation
        await self.query_one(ChatLog).show(conversation)

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
        self.query_one(PromptInput).clear()
        error = self.workspace.ensure_chat()
        if error:  # the exchange goes on in memory; saving is retried at the next send
            self.notify(error, severity="error", timeout=15)
        self._sending = True  # `generating` from now, not from when the worker starts
        self._started = False
        self._pending_text = text
        self.generate(text)
        return True

    @work(exclusive=True, group="generate")
    async def generate(self, prompt: str) -> None:
        """Consume the session's event stream; the refresh timer does the drawing."""
        self._started = True
        predicted = self._forecast.of(prompt)
        self._pace.begin(self.backend.shares_cpu)
        self.session.batch_s = self._pace.batch_s
        try:
            exchange = self.session.begin(prompt)
        except InputError as exc:
            self._pace.end()
            self.notify(str(exc), severity="warning", markup=False)
            self._sending = False
            return
        if predicted is not None:
            self._predicted[exchange.answer.id] = predicted
        stream = self.session.run(exchange)
        try:
            self.refresh_status()
            log = self.query_one(ChatLog)
            self._streaming = (exchange, await log.add_exchange(exchange, self._pace))
            # A fast stream may never suspend the loop: the UI gets a turn every few ms.
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
                self._pace.end()
                with contextlib.suppress(NoMatches):
                    self.refresh_status()

    async def _finish_exchange(self) -> None:
        if self._streaming is None:
            return
        exchange, view = self._streaming
        try:
            await chat_log.draw_rest(self, exchange, view, self._pace.step)
            await self.refresh_live(force=True)
            if exchange.metrics is not None:
                predicted = self._predicted.get(exchange.answer.id)
                footer = answer_footer(exchange.metrics, predicted, exchange.trim_note)
                if error := exchange.answer.error:
                    self.last_error = error
                    self.notify(error, title="answer failed", severity="error", markup=False)
                await view.finish(chat_log.footer_of(exchange.answer, footer))
                await verdict_view.add_verdict(view, exchange)
                self.call_after_refresh(chat_log.settle_heap, len(self.screen_stack) > 1)
        except NoMatches:
            pass  # the app is shutting down: the answer itself was saved by the session
        finally:
            # Only now: `generating` turns false once the answer is final on screen.
            self._streaming = None
            with contextlib.suppress(NoMatches):  # the app may be shutting down
                self.refresh_status()

    # -- the refresh timer -----------------------------------------------------------
    async def refresh_live(self, force: bool = False) -> None:
        """Move new text into the streaming answer, redraw the panel (chat_log.Pace);
        a backlog is drawn a frame's worth at a time, frame after frame."""
        try:
            panel = self.query_one(LivePanel)
        except NoMatches:  # the timer can fire once more while the app shuts down
            return
        if self._streaming is not None:
            if not self._pace.due(force):
                return
            exchange, view = self._streaming
            if await draw_answer(exchange, view, self._pace.step):
                self.call_after_refresh(self.refresh_live, True)
        elif self.session.exchanges:
            exchange = self.session.exchanges[-1]
        else:
            panel.show(Content.assemble(("no answers yet   ", "dim"), self._forecast_content()))
            return
        if self.generating and not self._pace.panel_due():
            return
        trimmer = self.session.trimmer
        trim = self.session.trim_stats() if trimmer.summaries or trimmer.pending else None
        if self.generating:
            panel.show(panel_content(exchange, None, trim))
            return
        panel.show(panel_content(exchange, self._forecast_content(), trim))
        self.query_one(ChatLog).mark_summarized(trimmer.covered if trimmer.enabled else frozenset())

    def _forecast_content(self) -> Content:
        """The forecast of the draft in the prompt box."""
        try:
            draft = self.query_one(PromptInput).text
        except NoMatches:
            return Content("")
        current = self._forecast.update(self.session, draft)
        return forecast_line(current) if current is not None else Content("")

    def refresh_status(self) -> None:
        last = self.session.exchanges[-1].metrics if self.session.exchanges else None
        status = status_content(self.backend, self.generating, last)
        self.query_one("#status", Static).update(status)

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
                prompt = self.query_one(PromptInput)
                if not prompt.text:
                    prompt.text = self._pending_text
                self.refresh_status()

    def action_retry(self) -> None:
        """Send the last user message again."""
        users = [m for m in self.session.conversation.messages if m.role == "user"]
        if users and not self.generating:
            self.send(users[-1].content)

    def action_switch_backend(self) -> None:
        """Pick a backend profile, seeing what the switch costs first."""
        dialogs.switch_backend(self)

    def action_compare(self) -> None:  # replay the last prompt elsewhere: tui/replay.py
        replay.replay_last(self)

    def action_chats(self) -> None:
        """Saved chats: open one (it replaces the chat on screen), search, manage."""
        dialogs.chats(self)

    def action_new_chat(self) -> None:
        """Start an empty chat (the current one stays saved)."""

        async def reset() -> None:
            await self.stop_and_wait()
            await self.show_conversation(self.workspace.new_chat())

        self.run_worker(reset(), group="chat")

    def action_settings(self) -> None:
        """Engine parameters and the trimmer; applied from the next message, saved."""
        dialogs.settings(self)

    def toggle_trimming(self) -> None:
        """Turn the history trimmer on or off (saved)."""
        dialogs.toggle_trimming(self)

    def action_history(self) -> None:
        self.push_screen(HistoryScreen(self.session.exchanges))

    def action_toggle_telemetry(self) -> None:
        panel = self.query_one(LivePanel)
        panel.display = not panel.display

    def action_toggle_thinking(self) -> None:
        """Fold or unfold the newest answer's thinking (a thinking model's chain of thought)."""
        if not self.query_one(ChatLog).toggle_thinking():
            self.notify("no answer here has any thinking to show")

    def action_focus_prompt(self) -> None:
        self.query_one(PromptInput).focus()

    def export_chat(self) -> None:
        """Write the chat on screen to the exports folder (from memory)."""
        dialogs.export_chat(self)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from dialogs.commands(self)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """One place for worker failures: say what broke, keep the app running."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.last_error = f"{type(error).__name__}: {error}"
            self.notify(self.last_error, title="internal error", severity="error", markup=False)
            self.refresh_status()

    async def on_unmount(self) -> None:
        self._forecast.close()
        running = [w for w in self.workers if w.group == "generate" and not w.is_finished]
        self.workers.cancel_all()
        for worker in running:  # let a cancelled answer save its final state first
            with contextlib.suppress(WorkerCancelled, WorkerFailed, TimeoutError):
                await asyncio.wait_for(worker.wait(), 5)
        await self.workspace.aclose()
