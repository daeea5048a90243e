"""The chat screen: it draws the `Workspace`'s chat (chat/workspace.py) and owns what
happens on it: the commands' actions (tui/commands.py; their keys are bound by the app,
so they work over the other full screens too, and run here), the generation worker,
the refresh timer, the retry of failed saves and the editing of a question. The state
itself (backends, turns, store, config) lives in the workspace, which the app holds
(tui/app.py).

Data flows one way: the screen drives the workspace's `TurnController`, which wraps a
backend's event stream in the telemetry recorder. The generation worker only consumes
events; a timer (REFRESH_HZ, slower beside a local engine: chat_log.Pace) moves new
text into the chat and redraws the telemetry panel from the exchange's live figures, so
the UI's cost per second is fixed whatever the token rate.
"""

from __future__ import annotations

import asyncio
import contextlib

from textual import on, work
from textual.app import ComposeResult
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import MountError
from textual.widgets import Footer, Static
from textual.worker import WorkerCancelled, WorkerFailed

from phasechat.backends.base import Backend
from phasechat.backends.tokens import estimate_text
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.costs import DraftForecast, EditForecast, history_metrics
from phasechat.chat.store.export_files import memory_stem, unsaved_summary, write_chat_files
from phasechat.chat.text import one_line
from phasechat.chat.trips.branches import branch_comparison
from phasechat.chat.turns import (
    Exchange,
    InputError,
    SaveFailed,
    SaveRecovered,
    TurnController,
    TurnEvent,
)
from phasechat.chat.workspace import Workspace
from phasechat.telemetry.forecast import Forecast, measured_rates
from phasechat.telemetry.timeline import timeline_of
from phasechat.tui import commands, compare_picker, dialogs, servers
from phasechat.tui.host import BUSY
from phasechat.tui.screens import sweep_screen
from phasechat.tui.screens.ablate_screen import AblateScreen
from phasechat.tui.screens.compare_screen import SIDE_TRIP, CompareScreen
from phasechat.tui.screens.confirm import ConfirmScreen
from phasechat.tui.screens.history_screen import HistoryScreen
from phasechat.tui.screens.prompt_view import PromptView
from phasechat.tui.screens.timeline_view import TimelineView
from phasechat.tui.widgets import chat_log, verdict_view
from phasechat.tui.widgets.chat_log import ChatLog, Pace, draw_answer, editing_title
from phasechat.tui.widgets.chat_widgets import LivePanel, MessageView, PromptInput
from phasechat.tui.widgets.telemetry_view import (
    RANK,
    PanelLine,
    answer_footer,
    edit_forecast_line,
    forecast_line,
    panel_lines,
    status_content,
)
from phasechat.tui.widgets.welcome import Welcome

REFRESH_HZ = 15
#: how many cold runs of each side "run each again" makes in a branch comparison
BRANCH_RUNS = 3
#: How often writes that failed (a full disk) are tried again while nothing streams.
SAVE_RETRY_S = 2.0
ACTIONS = commands.by_action()


class ChatScreen(Screen[None]):
    """The chat: messages, the live telemetry panel, the prompt box, the status line."""

    def __init__(self, workspace: Workspace) -> None:
        """Draw `workspace`'s chat."""
        super().__init__()
        self.workspace = workspace
        self._streaming: tuple[Exchange, MessageView] | None = None
        #: the question (or system prompt) the prompt box is editing, and the draft it
        #: replaced there
        self._editing: ChatMessage | None = None
        self._draft = ""
        self._forecast = DraftForecast()
        self._edit_forecast = EditForecast()
        self._pace = Pace()  # how the streaming answer is drawn
        self._predicted: dict[int, Forecast] = {}
        #: the backend's state and detail the status line last showed
        self._status_seen: tuple[str, str] = ("", "")
        self.last_error = ""
        #: set once the chat is drawn and its prompt has the focus (the app waits for it)
        self.drawn = asyncio.Event()

    @property
    def turns(self) -> TurnController:
        """The chat's turns (read it; change the chat only through its methods)."""
        return self.workspace.turns

    @property
    def backend(self) -> Backend:
        """The backend that answers next."""
        return self.turns.backend  # the controller holds it; the workspace only asks it

    @property
    def generating(self) -> bool:
        """A turn is under way, or its answer is not yet final on screen."""
        return self.turns.busy or self._streaming is not None

    # -- layout ----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Welcome(id="welcome")
        yield ChatLog(id="log")
        yield LivePanel(id="telemetry")
        yield PromptInput(id="prompt", show_line_numbers=False)
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        try:
            self._watch_saves()
            self.query_one(ChatLog).anchor()
            self.query_one(PromptInput).focus()
            self._pace.drive(self, self.refresh_live, REFRESH_HZ, self.query_one(PromptInput))
            self.load_backend()
            self.refresh_status()
        finally:  # the app waits for it: an error here must not hang it
            self.drawn.set()

    def _watch_saves(self) -> None:
        """Show a failed save the moment it happens (and when saving works again), and
        try the failed writes again every SAVE_RETRY_S while no answer streams."""
        ws = self.workspace

        def retry() -> None:
            if ws.store is not None and ws.store.error is not None and not self.generating:
                ws.retry_save()

        self.turns.subscribe(self._told)
        self.set_interval(SAVE_RETRY_S, retry)

    def _told(self, event: TurnEvent) -> None:
        """How saving goes, from the turn controller's subscribers' events."""
        match event:
            case SaveFailed(line):
                self.notify(line + "; Ctrl+P > Export this chat", severity="error", timeout=15)
            case SaveRecovered(line):
                self.notify(line)

    # -- backends --------------------------------------------------------------------
    @work(exclusive=True, group="load")
    async def load_backend(self) -> None:
        backend = self.backend
        self.refresh_status()
        if not backend.exact_token_counts:
            # Load the tiktoken encoding off the UI thread now, not on the first send.
            await asyncio.to_thread(estimate_text, "warm up")
        starting = asyncio.ensure_future(backend.start())
        await asyncio.sleep(0)  # `start` says "loading" before it waits for the load
        self.refresh_status()
        await starting
        self.refresh_status()
        if backend.state == "failed":
            self.notify(
                backend.state_detail, title="backend failed", severity="error", markup=False
            )

    def reload_backend(self) -> None:
        self.load_backend()

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
        """Draw `conversation` (the workspace's, just opened or made) from the top."""
        self._stop_editing()
        await self.query_one(ChatLog).show(conversation)
        self.refresh_welcome()

    # -- sending ---------------------------------------------------------------------
    @on(PromptInput.Submitted)
    def submit(self, event: PromptInput.Submitted) -> None:
        self.send(event.text)

    @on(PromptInput.StopRequested)
    def stop_requested(self) -> None:
        if self.generating or self._editing is None:
            self.action_stop()
        else:
            self._stop_editing(restore=True)

    def send(self, text: str) -> bool:
        """Send `text`: the next question, or (while editing one) its replacement on a
        new branch; False (with a message) when it can't be."""
        if self.refused_while_answering():
            return False
        editing = self._editing
        if not text.strip() and (editing is None or editing.role != "system"):
            self.notify("empty prompt: type a message first", severity="warning")
            return False
        error = self.workspace.ensure_chat()
        if error:  # the exchange goes on in memory; saving is retried at the next send
            self.notify(error, severity="error", timeout=15)
        predicted = self._forecast.of(text) if editing is None else None
        turns, leaf = self.turns, self.turns.conversation.leaf
        exchange: Exchange | None
        try:
            if editing is None:
                exchange = turns.begin(text)
            elif editing.role == "system":
                exchange = turns.edit_system(text)
            else:
                exchange = turns.edit(editing.id, text)
        except InputError as exc:
            self.notify(str(exc), severity="warning", markup=False)
            if turns.conversation.leaf != leaf:  # e.g. a question the template refused
                self.run_worker(self.query_one(ChatLog).show_path(turns.conversation))
            return False
        self.query_one(PromptInput).clear()
        self._stop_editing()
        if exchange is None:  # a system prompt set on an empty chat: nothing to answer
            self.notify("system prompt set: it applies from the first message")
            self.run_worker(self.query_one(ChatLog).show_path(turns.conversation))
            return True
        if predicted is not None:
            self._predicted[exchange.answer.id] = predicted
        self._start(exchange)
        return True

    def _start(self, exchange: Exchange) -> None:
        """Generate `exchange`, paced from now: a refresh between here and the worker's
        start would otherwise draw the panel at the unshared rate."""
        self._pace.begin(self.turns.shares_cpu)
        self.generate(exchange)

    @work(exclusive=True, group="generate")
    async def generate(self, exchange: Exchange) -> None:
        """Draw the new turn, then start it and wait for its end; the refresh timer draws
        the answer as it grows (from the exchange, not from the turn's events)."""
        shared = self.turns.shares_cpu
        self._pace.begin(shared)
        self.turns.deliver_every(self._pace.batch_s)
        try:
            self.refresh_status()
            log = self.query_one(ChatLog)
            view = await log.show_path(self.turns.conversation, exchange.answer, self._pace.step)
            assert view is not None
            self._streaming = (exchange, view)
            if shared:  # one frame: the layout of the new turn, before its prefill
                await chat_log.next_frame(self.app)
            await self.turns.run(exchange)  # cancelling this worker stops the turn
        finally:
            try:
                self.turns.abandon(exchange)  # cancelled before it started: still finished
                await self._finish_exchange()
            finally:
                self._pace.end()
                with contextlib.suppress(NoMatches):
                    self.refresh_status()

    async def _finish_exchange(self) -> None:
        if self._streaming is None:
            return
        exchange, view = self._streaming
        try:
            await chat_log.draw_rest(self.app, exchange, view, self._pace.step)
            await self.refresh_live(force=True)
            if exchange.metrics is not None:
                predicted = self._predicted.get(exchange.answer.id)
                footer = answer_footer(exchange.metrics, predicted, exchange.trim_note)
                if error := exchange.answer.error:
                    self.last_error = error
                    self.notify(error, title="answer failed", severity="error", markup=False)
                await view.finish(chat_log.footer_of(exchange.answer, footer))
                await verdict_view.add_verdict(view, exchange)
                self.call_after_refresh(chat_log.settle_heap, len(self.app.screen_stack) > 1)
        except (NoMatches, MountError):
            pass  # the app is shutting down: the answer itself was saved by the store's listener
        finally:
            # Only now: `generating` turns false once the answer is final on screen.
            self._streaming = None
            with contextlib.suppress(NoMatches):
                self.query_one(ChatLog).finished()
            with contextlib.suppress(NoMatches):  # the app may be shutting down
                self.refresh_status()

    # -- the refresh timer -----------------------------------------------------------
    async def refresh_live(self, force: bool = False) -> None:
        """Move new text into the streaming answer, redraw the panel (chat_log.Pace);
        a backlog is drawn a frame's worth at a time, frame after frame. Nothing while
        another screen is on top (the chat is not what the user is looking at): the
        timer costs nothing then, as when the app's queries saw only the top screen."""
        if not self.is_current:
            return
        try:
            panel = self.query_one(LivePanel)
        except NoMatches:  # the timer can fire once more while the app shuts down
            return
        backend = self.backend
        if self._status_seen != (backend.state, backend.state_detail):
            # what the load is doing now (the first screen says it), or an engine ended
            # while nothing was asked of it ("the engine did not answer for 5 s: ended")
            self.refresh_status()
        if self._streaming is not None:
            if not self._pace.due(force):
                return
            exchange, view = self._streaming
            if await draw_answer(exchange, view, self._pace.step):
                self.call_after_refresh(self.refresh_live, True)
        elif self.turns.exchanges:
            exchange = self.turns.exchanges[-1]
        else:
            first = Content.assemble(("no answers yet   ", "dim"), self._forecast_content())
            panel.show([PanelLine(first, RANK["forecast"])])
            return
        if self.generating and not self._pace.panel_due():
            return
        trimmer = self.turns.trimmer
        trim = self.turns.trim_stats() if trimmer.summaries or trimmer.pending else None
        if self.generating:
            panel.show(panel_lines(exchange, None, trim))
            return
        editing = self._editing is not None
        panel.show(panel_lines(exchange, self._forecast_content(), trim, editing))
        self.query_one(ChatLog).mark_summarized(trimmer.covered if trimmer.enabled else frozenset())

    def _forecast_content(self) -> Content:
        """The forecast of the draft in the prompt box (of the edit, while editing)."""
        try:
            draft = self.query_one(PromptInput).text
        except NoMatches:
            return Content("")
        if (editing := self._editing) is not None:
            expected = self._edit_forecast.update(self.turns, draft, editing.id)
            if expected is None:
                return Content("")
            return edit_forecast_line(expected, editing.role == "system")
        current = self._forecast.update(self.turns, draft)
        return forecast_line(current) if current is not None else Content("")

    def refresh_status(self) -> None:
        self._status_seen = (self.backend.state, self.backend.state_detail)
        last = self.turns.exchanges[-1].metrics if self.turns.exchanges else None
        status = status_content(self.backend, self.generating, last)
        self.query_one("#status", Static).update(status)
        self.refresh_welcome()

    def refresh_welcome(self) -> None:
        """The first screen, while the chat on screen has no answer."""
        welcome = self.query_one(Welcome)
        shown = self.query_one(ChatLog).drawn_messages()
        welcome.display = not any(m.role == "assistant" for m in shown)
        if welcome.display:
            welcome.show_for(self.backend)

    # -- actions ---------------------------------------------------------------------
    def refused_while_answering(self) -> bool:
        """True, and says so once, while an answer is being sent, streamed or drawn: the
        one place an action that changes the chat is refused for it."""
        if self.generating:
            self.notify(BUSY, severity="warning")
            return True
        return False

    async def stop_and_wait(self) -> None:
        """Stop a streaming answer and return once it is saved and final on screen."""
        running = [w for w in self.workers if w.group == "generate" and not w.is_finished]
        self.action_stop()
        for worker in running:
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await worker.wait()

    def action_stop(self) -> None:
        """Stop the answer being generated; its partial text is kept."""
        if self.turns.stop():
            self.refresh_status()

    def action_retry(self) -> None:
        """Answer the last question again; the previous answer stays, as a sibling."""
        if self.refused_while_answering():
            return
        error = self.workspace.ensure_chat()
        if error:
            self.notify(error, severity="error", timeout=15)
        try:
            exchange = self.turns.retry()
        except InputError as exc:
            self.notify(str(exc), severity="warning", markup=False)
            return
        self._stop_editing()
        self._start(exchange)

    # -- editing and branches --------------------------------------------------------
    @on(MessageView.EditRequested)
    def edit_message(self, event: MessageView.EditRequested) -> None:
        """Put a question (or the system prompt) into the prompt box to edit; sending it
        makes a new branch from there."""
        message = event.message
        if message.role == "assistant":
            self.notify("answers are not edited: Ctrl+R asks again (the old answer stays)")
            return
        prompt = self.query_one(PromptInput)
        if self._editing is None:
            self._draft = prompt.text
        self._editing = message
        prompt.text = message.content
        prompt.border_title = editing_title(message, self.turns.conversation)
        prompt.add_class("-editing")
        prompt.focus()

    def _stop_editing(self, restore: bool = False) -> None:
        """Leave editing; `restore`: the draft typed before comes back."""
        if self._editing is None:
            return
        self._editing = None
        prompt = self.query_one(PromptInput)
        prompt.border_title = None
        prompt.remove_class("-editing")
        if restore:
            prompt.text = self._draft
        self._draft = ""

    @on(MessageView.CompareRequested)
    def compare_branches(self, event: MessageView.CompareRequested) -> None:
        """A message's branch and its next sibling's, side by side (chat/trips/branches.py)."""
        if self.refused_while_answering():
            return
        try:
            comparison = branch_comparison(self.turns, event.message)
        except InputError as exc:
            self.notify(str(exc), severity="warning", markup=False)
            return
        heading = Content.assemble(
            ("Two branches", "bold"),
            " as they were answered (figures recorded then, with the cache as it was); "
            f"n runs each {BRANCH_RUNS} times, cold\n",
            (SIDE_TRIP, "dim"),
        )
        self.app.push_screen(
            CompareScreen(comparison, run=False, heading=heading, rerun=BRANCH_RUNS)
        )

    @on(MessageView.TimelineRequested)
    def show_timeline(self, event: MessageView.TimelineRequested) -> None:
        """An answer's own timeline: the gap before each token, stalls, bursts."""
        exchange = next((e for e in self.turns.exchanges if e.answer.id == event.message.id), None)
        if exchange is None or exchange.metrics is None or not exchange.trace.times:
            self.notify("the timeline is kept for the answers of this session, once finished")
            return
        number = [e.answer.id for e in self.turns.exchanges].index(exchange.answer.id) + 1
        title = f"the timeline of answer {number} · {one_line(exchange.metrics.backend)}"
        remote = exchange.metrics.connect_ms is not None
        view = TimelineView(timeline_of(exchange.trace), exchange.metrics, title, remote)
        self.app.push_screen(view)

    @on(MessageView.SiblingRequested)
    async def show_sibling(self, event: MessageView.SiblingRequested) -> None:
        """Show the previous or next sibling's branch (‹2/3›); the chat goes on there."""
        if self.refused_while_answering():
            return
        shown = self.turns.show_sibling(event.message.id, event.step)
        if shown is None:
            return
        self._stop_editing()
        await self.query_one(ChatLog).show_path(self.turns.conversation, reveal=shown)
        self.query_one(ChatLog).focus_message(shown.id)
        self.refresh_status()

    def action_edit_system(self) -> None:
        """Edit the system prompt in the prompt box (Enter: a new branch with it)."""
        self.post_message(MessageView.EditRequested(self.turns.conversation.root))

    def action_select_message(self) -> None:
        """Move to the newest message (then ↑/↓, ←/→ for its siblings, e to edit)."""
        if not self.query_one(ChatLog).focus_message(None):
            self.notify("no messages yet")

    def action_switch_backend(self) -> None:
        """Pick a backend profile, seeing what the switch costs first."""
        servers.switch_backend(self)

    def action_compare(self) -> None:
        """The last prompt sent elsewhere, side by side (tui/compare_picker.py)."""
        compare_picker.compare_last(self)

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

    def action_prompt_view(self) -> None:
        """The prompt the selected answer (else the newest) was given, as the engine read
        it: its sections, the cache break, the exact text."""
        path = self.turns.conversation.messages
        answers = [m for m in path if m.role == "assistant" and m.anatomy is not None]
        chosen = answers[-1] if answers else None
        if isinstance(view := self.focused, MessageView):  # the first answer from there
            ids = [m.id for m in path]
            at = ids.index(view.message.id) if view.message.id in ids else len(ids)
            chosen = next((m for m in answers if ids.index(m.id) >= at), chosen)
        if chosen is None or chosen.anatomy is None:
            self.notify("no prompt to show yet: its sections come with the first answer")
            return
        number = [m.id for m in answers].index(chosen.id) + 1
        self.app.push_screen(PromptView(chosen.anatomy, f"the prompt of answer {number}"))

    def action_ablate(self) -> None:
        """The chat's last turn again without each part of its prompt (cold, side trip)."""
        if self.refused_while_answering():
            return
        last = self.turns.last_request()
        if last is None:
            self.notify("no answered question yet: ablation re-runs the last turn")
            return
        rates = measured_rates(history_metrics(self.turns), self.backend.name)
        screen = AblateScreen.planned(self.backend, self.turns.settings, last[0], rates)
        if screen is None:
            self.notify("the last prompt has nothing to remove: no system prompt, no earlier turn")
        elif not screen.long:
            self.app.push_screen(screen)
        else:  # the count and the estimate first: a long job is asked about (issue 38)

            def answered(start: bool | None) -> None:
                if start and not self.refused_while_answering():
                    self.app.push_screen(screen)

            question = f"Start {screen.total:,} cold runs?"
            self.app.push_screen(ConfirmScreen(question, screen.plan), answered)

    def action_history(self) -> None:
        self.app.push_screen(HistoryScreen(self.turns.exchanges))

    def action_toggle_telemetry(self) -> None:
        panel = self.query_one(LivePanel)
        panel.display = not panel.display

    def action_toggle_thinking(self) -> None:
        """Fold or unfold the newest answer's thinking (a thinking model's chain of thought)."""
        if not self.query_one(ChatLog).toggle_thinking():
            self.notify("no answer here has any thinking to show")

    def action_focus_prompt(self) -> None:
        self.query_one(PromptInput).focus()

    def action_toggle_trimming(self) -> None:
        """Turn the history trimmer on or off (saved)."""
        enabled, error = self.workspace.toggle_trimming()
        if error:
            self.notify(error, severity="error", markup=False)
        self.notify(f"history trimming {'on' if enabled else 'off'}")

    def action_export_chat(self) -> None:
        """The chat on screen, from memory, to the exports folder: works when saving
        failed."""
        conversation = self.turns.conversation
        if not conversation.messages:
            self.notify("nothing to export yet", severity="warning")
            return
        chat_id = self.workspace.chat_id()
        try:
            md = write_chat_files(
                unsaved_summary(conversation, chat_id),
                conversation,
                memory_stem(chat_id),
                self.workspace.saved_rows(),
            )
        except OSError as exc:
            self.notify(f"export failed: {exc}", severity="error")
            return
        self.notify(f"exported to {md} and .json")

    def action_sweep(self) -> None:
        """A concurrency sweep of the backend (remote ones only)."""
        sweep_screen.open_sweep(self)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A command's key and palette entry run only while it is enabled
        (tui/commands.py)."""
        command = ACTIONS.get(action)
        if command is not None and command.enabled is not None:
            return command.enabled(self)
        return True

    async def on_unmount(self) -> None:
        self._forecast.close()
        self._edit_forecast.close()
        running = [w for w in self.workers if w.group == "generate" and not w.is_finished]
        self.workers.cancel_node(self)  # the screen's own: its answer, its loads
        for worker in running:  # let a cancelled answer save its final state first
            with contextlib.suppress(WorkerCancelled, WorkerFailed, TimeoutError):
                await asyncio.wait_for(worker.wait(), 5)
