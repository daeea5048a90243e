"""The app's session features, kept apart from streaming and layout: themes and their
memory, chat persistence, and the modal screens (switch backend, chats, settings,
history)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from textual.app import App
from textual.theme import Theme

from backends.base import Backend
from chat.config import Config, TrimConfig, config_path, save_config
from chat.conversation import Conversation
from chat.profiles import BackendSpec, make_backend
from chat.session import ChatSession, Settings
from chat.store import ChatStore
from themes import BUILTIN_THEMES, DEFAULT_THEME, load_user_themes
from tui.chats_screen import ChatsScreen
from tui.history_screen import HistoryScreen
from tui.panel import switch_cost
from tui.settings_screen import SettingsScreen
from tui.switch_screen import SwitchScreen


class SessionFeatures(App[None]):
    """Mixed into PhasechatApp, which provides these attributes and the two coroutines."""

    session: ChatSession
    config: Config
    store: ChatStore | None
    profiles: dict[str, BackendSpec]
    backends: dict[str, Backend]
    _owned: set[str]

    @property
    def backend(self) -> Backend:
        return self.session.backend

    async def stop_and_wait(self) -> None:
        raise NotImplementedError

    async def switch_to(self, name: str) -> None:
        raise NotImplementedError

    async def show_conversation(self, conversation: Conversation) -> None:
        raise NotImplementedError

    def _setup_themes(self) -> None:
        """Built-in and user themes; the one last chosen; remember the next choice."""
        for theme in BUILTIN_THEMES:
            self.register_theme(theme)
        user, errors = load_user_themes(config_path().parent / "themes")
        for theme in user:
            self.register_theme(theme)
        for error in errors:
            self.notify(error, title="theme", severity="warning")
        wanted = self.config.theme or DEFAULT_THEME
        self.theme = wanted if wanted in self.available_themes else DEFAULT_THEME
        self.theme_changed_signal.subscribe(self, self._remember_theme)

    def _remember_theme(self, theme: Theme) -> None:
        if theme.name != self.config.theme:
            self._save_config(replace(self.config, theme=theme.name))

    def _save_config(self, config: Config) -> None:
        try:
            save_config(config, config.path)
        except OSError as exc:
            self.notify(f"config not saved: {exc}", severity="error")
            return
        self.config = config

    def _open_store(self) -> None:
        """Save the chat as it happens: a chat is created with the first message."""
        try:
            self.store = ChatStore()
        except (sqlite3.Error, OSError) as exc:
            self.notify(f"chats will not be saved: {exc}", severity="error")

    def _ensure_chat(self) -> None:
        store = self.store
        if store is not None and store.chat_of(self.session) is None:
            store.attach(self.session, store.create_chat(system=self.session.settings.system))

    def action_switch_backend(self) -> None:
        """Pick a backend profile, seeing what the switch costs first."""
        rows = [
            (spec, switch_cost(self.session, spec, self.backends.get(name)))
            for name, spec in self.profiles.items()
        ]

        async def chosen(name: str | None) -> None:
            if name:
                await self.switch_to(name)

        self.push_screen(SwitchScreen(rows, self.backend.name), chosen)

    def action_chats(self) -> None:
        """Saved chats: open one (it replaces the chat on screen), search, manage."""
        store = self.store
        if store is None:
            self.notify("chats are not being saved (see the earlier error)", severity="error")
            return

        async def chosen(chat_id: int | None) -> None:
            if chat_id is not None and store is not None:
                await self.stop_and_wait()
                store.detach(self.session)
                store.resume(self.session, chat_id)
                await self.show_conversation(self.session.conversation)

        self.push_screen(ChatsScreen(store), chosen)

    def action_new_chat(self) -> None:
        """Start an empty chat (the current one stays saved)."""

        async def reset() -> None:
            await self.stop_and_wait()
            if self.store is not None:
                self.store.detach(self.session)
            await self.show_conversation(Conversation(system=self.session.settings.system))

        self.run_worker(reset(), group="chat")

    def action_settings(self) -> None:
        """Engine parameters and the trimmer; applied from the next message, saved."""

        def chosen(result: tuple[Settings, TrimConfig] | None) -> None:
            if result is None:
                return
            settings, trim = result
            self.session.update_settings(
                system=settings.system,
                temperature=settings.temperature,
                max_tokens=settings.max_tokens,
                stop=settings.stop,
            )
            engine = replace(
                self.config.engine,
                system=settings.system,
                temperature=settings.temperature,
                max_tokens=settings.max_tokens,
                stop=settings.stop,
            )
            self._save_config(replace(self.config, engine=engine, trim=trim))
            self.apply_trim_config()
            self.notify("settings saved; they apply from the next message")

        screen = SettingsScreen(self.session.settings, self.config.trim, list(self.profiles))
        self.push_screen(screen, chosen)

    def apply_trim_config(self) -> None:
        """Configure the session's trimmer from `[trim]` (the summarizer by profile name)."""
        trim, trimmer = self.config.trim, self.session.trimmer
        trimmer.enabled, trimmer.budget, trimmer.keep_last = (
            trim.enabled,
            trim.budget,
            trim.keep_last,
        )
        name = trim.summarizer
        if name is None or name not in self.profiles:
            trimmer.summarizer = None
            return
        backend = self.backends.get(name)
        if backend is None:
            backend = self.backends[name] = make_backend(self.profiles[name])
            self._owned.add(name)
            self.run_worker(backend.start(), group="load-summarizer")
        trimmer.summarizer = backend

    def toggle_trimming(self) -> None:
        """Turn the history trimmer on or off (saved)."""
        trim = replace(self.config.trim, enabled=not self.config.trim.enabled)
        self._save_config(replace(self.config, trim=trim))
        self.apply_trim_config()
        self.notify(f"history trimming {'on' if trim.enabled else 'off'}")

    def action_history(self) -> None:
        self.push_screen(HistoryScreen(self.session.exchanges))
