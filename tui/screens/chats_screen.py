"""Saved chats: list, search, open, rename, delete, export."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, OptionList
from textual.widgets.option_list import Option

from phasechat.chat.store.database import ChatNotFound, ChatStore, ChatSummary
from phasechat.chat.store.export_files import write_chat_files
from phasechat.chat.text import one_line
from phasechat.tui.screens.confirm import ConfirmScreen


class ChatsScreen(ModalScreen[int | None]):
    """Pick a saved chat (returns its id), or manage them in place."""

    DEFAULT_CSS = """
    ChatsScreen { align: center middle; }
    ChatsScreen > Vertical { width: 90%; height: 80%; background: $surface;
        border: thick $primary; padding: 0 1; }
    ChatsScreen OptionList { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Close", id="chats-close"),
        Binding("ctrl+d", "delete", "Delete", id="chats-delete"),
        Binding("ctrl+e", "export", "Export .md/.json", id="chats-export"),
        Binding("ctrl+n", "rename", "Rename to search text", id="chats-rename"),
    ]

    def __init__(self, store: ChatStore) -> None:
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Input(placeholder="search chats (words in any message)", id="search")
            yield OptionList(id="chats")
            yield Footer()

    def on_mount(self) -> None:
        try:
            self.fill(self.store.list_chats())
        except sqlite3.Error as exc:
            self.notify(f"chats cannot be listed: {exc}", severity="error")

    def fill(self, chats: list[ChatSummary]) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        for c in chats:
            when = c.updated if c.updated is not None else "updated: unknown"
            label = Content.assemble(
                (one_line(c.title or "(untitled)"), "bold"),
                (f"  {one_line(c.backend or '-')} · {c.messages} messages · {when}", "dim"),
            )
            options.add_option(Option(label, id=str(c.id)))
        if not chats:
            options.add_option(Option(Content("no chats"), disabled=True))

    @on(Input.Changed, "#search")
    def search(self, event: Input.Changed) -> None:
        text = event.value.strip()
        try:
            if not text:
                self.fill(self.store.list_chats())
                return
            ids = dict.fromkeys(hit.chat_id for hit in self.store.search(text))
            self.fill([self.store.get(i) for i in ids])
        except (sqlite3.Error, ChatNotFound) as exc:
            self.notify(f"search failed: {exc}", severity="error")

    def _selected(self) -> int | None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        option_id = options.get_option_at_index(options.highlighted).id
        return int(option_id) if option_id else None

    @on(OptionList.OptionSelected)
    def open_chat(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        """Delete the highlighted chat, after a yes: it cannot be undone."""
        chat_id = self._selected()
        if chat_id is None:
            return
        try:
            title = self.store.get(chat_id).title
        except (sqlite3.Error, ChatNotFound) as exc:
            self.notify(f"delete failed: {exc}", severity="error")
            return

        def chosen(yes: bool | None) -> None:
            if yes:  # off the UI thread: a locked database waits up to its busy timeout
                self.run_worker(self._delete(chat_id), group="chats-delete")

        self.app.push_screen(
            ConfirmScreen(f"Delete chat {chat_id} and all its messages?", one_line(title)), chosen
        )

    async def _delete(self, chat_id: int) -> None:
        try:
            await asyncio.to_thread(self.store.delete, chat_id)
            self.fill(self.store.list_chats())
        except (sqlite3.Error, ChatNotFound) as exc:  # a locked database: say so, stay open
            self.notify(f"chat {chat_id} not deleted: {exc}", severity="error")
            return
        self.notify(f"deleted chat {chat_id}")

    def action_rename(self) -> None:
        chat_id = self._selected()
        title = self.query_one("#search", Input).value.strip()
        if chat_id is not None and title:
            try:
                self.store.rename(chat_id, title)
                self.fill(self.store.list_chats())
            except (sqlite3.Error, ChatNotFound, ValueError) as exc:
                self.notify(f"not renamed: {exc}", severity="error")

    def action_export(self) -> None:
        chat_id = self._selected()
        if chat_id is None:
            return
        try:
            summary, saved = self.store.get(chat_id), self.store.open_chat(chat_id)
            md = write_chat_files(summary, saved.conversation, f"chat-{chat_id}", saved.rows)
        except (OSError, sqlite3.Error, ChatNotFound) as exc:
            self.notify(f"export failed: {exc}", severity="error")
            return
        self.notify(f"exported to {md} and .json")

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
