"""The chat's dialogs, opened and their answers applied: saved chats, settings, and
the question before a link leaves the app (the backend switcher is tui/servers.py,
the comparison's picker tui/compare_picker.py). Kept apart from the chat screen so it
stays about layout, streaming and its commands."""

from __future__ import annotations

import sqlite3

from textual.app import App

from phasechat.chat.config.settings import Settings, TrimConfig
from phasechat.chat.store.database import ChatNotFound
from phasechat.chat.text import one_line, safe_link
from phasechat.tui.host import ChatHost
from phasechat.tui.screens.confirm import ConfirmScreen


def chats(chat: ChatHost) -> None:
    """Saved chats: the one opened replaces the chat on screen (the old one stays saved)."""
    store = chat.workspace.store
    if store is None:
        chat.notify("chats are not being saved (see the earlier error)", severity="error")
        return

    async def chosen(chat_id: int | None) -> None:
        if chat_id is None:
            return
        await chat.stop_and_wait()
        try:
            saved = chat.workspace.open_chat(chat_id)
        except (sqlite3.Error, ChatNotFound) as exc:  # a locked or damaged file: say so
            chat.notify(one_line(f"chat {chat_id} not opened: {exc}"), severity="error")
            return
        await chat.show_conversation(chat.turns.conversation)
        if saved.unreadable:  # the rest of the chat is shown and goes on
            more = f" (and {len(saved.unreadable) - 1} more)" if len(saved.unreadable) > 1 else ""
            chat.notify(one_line(saved.unreadable[0]) + more, severity="warning", timeout=15)

    from phasechat.tui.screens.chats_screen import ChatsScreen  # loaded when first opened

    chat.app.push_screen(ChatsScreen(store), chosen)


def open_link(app: App[None], href: str) -> None:
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


def settings(chat: ChatHost) -> None:
    """Engine parameters and the trimmer: applied from the next message, and saved."""
    ws = chat.workspace

    def chosen(result: tuple[Settings, TrimConfig] | None) -> None:
        if result is None:
            return
        summarizer, error = ws.apply_settings(*result)
        if summarizer is not None:
            chat.app.run_worker(summarizer.start(), group="load-summarizer")
        if error:
            chat.notify(error, severity="error", markup=False)
        elif ws.turns.system_changed:
            chat.notify(
                "settings saved; the new system prompt starts a branch at the next message"
                " (Ctrl+R: answer the last question with it); the old branch stays"
            )
        else:
            chat.notify("settings saved; they apply from the next message")
        chat.app.run_worker(chat.show_conversation(ws.turns.conversation))

    from phasechat.tui.screens.settings_screen import SettingsScreen  # loaded when first opened

    chat.app.push_screen(
        SettingsScreen(ws.turns.settings, ws.config.trim, list(ws.profiles)), chosen
    )
