"""The phasechat Textual app: it holds the themes, the `Workspace` (chat/workspace.py:
backends, turns, store, config) and the screens, the chat screen first
(tui/chat_screen.py, which draws the chat and owns its commands); and it says what went
wrong where nothing else did.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from textual.actions import parse
from textual.binding import BindingType
from textual.theme import Theme
from textual.worker import Worker, WorkerState

from phasechat.backends.base import Backend
from phasechat.chat.config.file import Config
from phasechat.chat.config.paths import themes_dir
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.text import one_line
from phasechat.chat.turns import TurnController
from phasechat.chat.workspace import Workspace
from phasechat.themes import BUILTIN_THEMES, DEFAULT_THEME, VARIABLE_DEFAULTS, load_user_themes
from phasechat.tui import commands, dialogs
from phasechat.tui.chat_screen import ChatScreen
from phasechat.tui.palette import ChatCommands
from phasechat.tui.plain import PlainTextApp
from phasechat.tui.widgets.markdown_view import RICH_THEME

#: how often the app looks whether the OpenTelemetry collector refused a batch (s)
TRACING_CHECK_S = 2.0


class PhasechatApp(PlainTextApp):
    """Chat with a local or remote model and watch prefill and decode live."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "phasechat"
    COMMANDS = PlainTextApp.COMMANDS | {ChatCommands}
    #: the commands' keys (tui/commands.py), the app's so that they work over the
    #: other full screens too (the compare view); each runs on the chat screen
    BINDINGS: ClassVar[list[BindingType]] = list(commands.bindings())

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
        #: the chat: the first screen, under every other
        self.chat = ChatScreen(self.workspace)

    @property
    def turns(self) -> TurnController:
        """The workspace's turns (read them; the chat screen changes them)."""
        return self.workspace.turns

    @property
    def backend(self) -> Backend:
        """The workspace's backend: the one that answers next."""
        return self.workspace.backend

    def get_default_screen(self) -> ChatScreen:
        return self.chat

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    async def on_mount(self) -> None:
        """Themes, the store and the summarizer; then the chat screen, mounted before
        the app says it is ready (as when the app drew the chat itself)."""
        self._setup_themes()
        self.console.push_theme(RICH_THEME)  # inline code readable on light themes too
        for line in self.workspace.open_store():
            failed = self.workspace.store is None
            self.notify(line, severity="error" if failed else "warning")
        summarizer = self.workspace.configure_trimmer(self.turns)
        if summarizer is not None:
            self.run_worker(summarizer.start(), group="load-summarizer")
        self._watch_tracing()
        await self.chat.drawn.wait()

    def _setup_themes(self) -> None:
        """Built-in and user themes; the one last chosen; remember the next choice."""
        for error in register_themes(self, self.workspace.config.theme):
            self.notify(error, title="theme", severity="warning", markup=False)

        def remember(theme: Theme) -> None:
            error = self.workspace.remember_theme(theme.name)
            if error:
                self.notify(error, severity="error", markup=False)

        self.theme_changed_signal.subscribe(self, remember)

    def _watch_tracing(self) -> None:
        """While tracing is on, show once each new problem of its exporter (a collector
        that refuses a batch or does not answer: telemetry/otel.py)."""
        tracing = self.workspace.tracing
        if tracing is None:
            return
        told: list[str] = []
        told_notes: list[str] = []

        def check() -> None:
            for note in tracing.notes[len(told_notes) :]:  # the SDK's settings, in our words
                told_notes.append(note)
                self.notify(note, title="OpenTelemetry", severity="warning", markup=False)
            problem = tracing.problem
            if problem and problem not in told[-1:]:
                told.append(problem)
                self.notify(problem, title="OpenTelemetry", severity="warning", markup=False)

        self.set_interval(TRACING_CHECK_S, check)

    async def action_chat(self, action: str) -> None:
        """A command's key: its action (tui/commands.py), run on the chat screen."""
        await self.run_action(action, self.chat)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A key runs only while its command is enabled (the chat screen says)."""
        if action == "chat" and parameters and isinstance(parameters[0], str):
            _namespace, name, arguments = parse(parameters[0])
            return self.chat.check_action(name, arguments)
        return True

    def action_follow_link(self, href: str) -> None:
        """A link clicked in a message (tui/widgets/markdown_view.py): see dialogs.open_link."""
        dialogs.open_link(self, href)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """One place for worker failures: say what broke, keep the app running."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.chat.last_error = f"{type(error).__name__}: {error}"
            self.notify(
                self.chat.last_error, title="internal error", severity="error", markup=False
            )
            self.chat.refresh_status()

    def _fatal_error(self) -> None:
        """An error nothing handled ends the app (Textual's rule; the exit status is 1),
        in one line instead of Textual's traceback, which lists local variables (an API
        key among them, maybe). The chat screen's unmount still saves the answer in
        progress."""
        import sys

        from rich.text import Text

        error = sys.exc_info()[1]
        self.chat.last_error = one_line(f"{type(error).__name__}: {error}")[:300]
        self.bell()
        self._exit_renderables.append(Text(f"phasechat: internal error: {self.chat.last_error}"))
        self._close_messages_no_wait()

    async def on_unmount(self) -> None:
        """After the screens (the chat's answer in progress saved): close the workspace."""
        self.workers.cancel_all()
        await self.workspace.aclose()


def register_themes(app: PlainTextApp, chosen: str | None) -> list[str]:
    """Register the built-in and user themes and select `chosen` (else the default).
    Returns one line per user theme that could not be loaded."""
    for theme in BUILTIN_THEMES:
        app.register_theme(theme)
    user, errors = load_user_themes(themes_dir())
    for theme in user:
        app.register_theme(theme)
    wanted = chosen or DEFAULT_THEME
    app.theme = wanted if wanted in app.available_themes else DEFAULT_THEME
    return errors
