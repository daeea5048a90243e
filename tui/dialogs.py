"""The app's modal screens, opened and their answers applied: saved chats, settings,
with their entries in the command palette; and the themes registered at start-up
(the backend switcher is tui/servers.py). Kept apart from the app so the app stays
about layout, streaming and bindings."""

from __future__ import annotations

import sqlite3

from textual.app import App
from textual.theme import Theme

from phasechat.chat.config.paths import themes_dir
from phasechat.chat.config.settings import Settings, TrimConfig
from phasechat.chat.store.database import ChatNotFound
from phasechat.chat.store.export_files import memory_stem, unsaved_summary, write_chat_files
from phasechat.chat.text import one_line, safe_link
from phasechat.themes import BUILTIN_THEMES, DEFAULT_THEME, load_user_themes
from phasechat.tui.host import ChatHost
from phasechat.tui.screens.confirm import ConfirmScreen


def register_themes(app: App[None], chosen: str | None) -> list[str]:
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


def chats(app: ChatHost) -> None:
    """Saved chats: the one opened replaces the chat on screen (the old one stays saved)."""
    store = app.workspace.store
    if store is None:
        app.notify("chats are not being saved (see the earlier error)", severity="error")
        return

    async def chosen(chat_id: int | None) -> None:
        if chat_id is None:
            return
        await app.stop_and_wait()
        try:
            saved = app.workspace.open_chat(chat_id)
        except (sqlite3.Error, ChatNotFound) as exc:  # a locked or damaged file: say so
            app.notify(one_line(f"chat {chat_id} not opened: {exc}"), severity="error")
            return
        await app.show_conversation(app.turns.conversation)
        if saved.unreadable:  # the rest of the chat is shown and goes on
            more = f" (and {len(saved.unreadable) - 1} more)" if len(saved.unreadable) > 1 else ""
            app.notify(one_line(saved.unreadable[0]) + more, severity="warning", timeout=15)

    from phasechat.tui.screens.chats_screen import ChatsScreen  # loaded when first opened

    app.push_screen(ChatsScreen(store), chosen)


#: How often writes that failed (a full disk) are tried again while nothing streams.
SAVE_RETRY_S = 2.0


def watch_saves(app: ChatHost) -> None:
    """Show a failed save the moment it happens (and when saving works again), and try
    the failed writes again every SAVE_RETRY_S while no answer streams."""
    ws = app.workspace

    def told(line: str, ok: bool) -> None:
        if ok:
            app.notify(line)
        else:
            app.notify(line + "; Ctrl+P > Export this chat", severity="error", timeout=15)

    def retry() -> None:
        if ws.store is not None and ws.store.error is not None and not app.generating:
            ws.retry_save()

    if ws.store is not None:
        ws.store.on_error = told
    app.set_interval(SAVE_RETRY_S, retry)


#: how often the app looks whether the OpenTelemetry collector refused a batch (s)
TRACING_CHECK_S = 2.0


def watch_tracing(app: ChatHost) -> None:
    """While tracing is on, show once each new problem of its exporter (a collector that
    refuses a batch or does not answer: telemetry/otel.py)."""
    tracing = app.workspace.tracing
    if tracing is None:
        return
    told: list[str] = []
    told_notes: list[str] = []

    def check() -> None:
        for note in tracing.notes[len(told_notes) :]:  # the SDK's settings, in our words
            told_notes.append(note)
            app.notify(note, title="OpenTelemetry", severity="warning", markup=False)
        problem = tracing.problem
        if problem and problem not in told[-1:]:
            told.append(problem)
            app.notify(problem, title="OpenTelemetry", severity="warning", markup=False)

    app.set_interval(TRACING_CHECK_S, check)


def open_link(app: ChatHost, href: str) -> None:
    """A link clicked in an answer: http(s) only, and only after the URL was shown."""
    url = safe_link(href)
    if url is None:
        shown = href[:200]
        app.notify(f"link not opened: only http and https links open ({shown})", severity="warning")
        return

    def chosen(yes: bool | None) -> None:
        if yes:
            app.open_url(url)

    app.push_screen(ConfirmScreen("Open this link in your browser?", one_line(url)), chosen)


def export_chat(app: ChatHost) -> None:
    """The chat on screen, from memory, to the exports folder: works when saving failed."""
    conversation = app.turns.conversation
    if not conversation.messages:
        app.notify("nothing to export yet", severity="warning")
        return
    chat_id = app.workspace.chat_id()
    try:
        md = write_chat_files(
            unsaved_summary(conversation, chat_id),
            conversation,
            memory_stem(chat_id),
            app.workspace.saved_rows(),
        )
    except OSError as exc:
        app.notify(f"export failed: {exc}", severity="error")
        return
    app.notify(f"exported to {md} and .json")


def settings(app: ChatHost) -> None:
    """Engine parameters and the trimmer: applied from the next message, and saved."""
    ws = app.workspace

    def chosen(result: tuple[Settings, TrimConfig] | None) -> None:
        if result is None:
            return
        summarizer, error = ws.apply_settings(*result)
        if summarizer is not None:
            app.run_worker(summarizer.start(), group="load-summarizer")
        if error:
            app.notify(error, severity="error", markup=False)
        elif ws.turns.system_changed:
            app.notify(
                "settings saved; the new system prompt starts a branch at the next message"
                " (Ctrl+R: answer the last question with it); the old branch stays"
            )
        else:
            app.notify("settings saved; they apply from the next message")
        app.run_worker(app.show_conversation(ws.turns.conversation))

    from phasechat.tui.screens.settings_screen import SettingsScreen  # loaded when first opened

    app.push_screen(SettingsScreen(ws.turns.settings, ws.config.trim, list(ws.profiles)), chosen)


def setup_themes(app: ChatHost) -> None:
    """Built-in and user themes; the one last chosen; remember the next choice."""
    for error in register_themes(app, app.workspace.config.theme):
        app.notify(error, title="theme", severity="warning", markup=False)

    def remember(theme: Theme) -> None:
        error = app.workspace.remember_theme(theme.name)
        if error:
            app.notify(error, severity="error", markup=False)

    app.theme_changed_signal.subscribe(app, remember)


def toggle_trimming(app: ChatHost) -> None:
    """Turn the history trimmer on or off (saved)."""
    enabled, error = app.workspace.toggle_trimming()
    if error:
        app.notify(error, severity="error", markup=False)
    app.notify(f"history trimming {'on' if enabled else 'off'}")
