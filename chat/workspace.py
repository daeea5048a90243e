"""The application's state, apart from any screen: which backends exist, which one
answers, the chat's turns (its `TurnController`), where it is saved, and the user's settings.

`phasechat ask`, `phasechat bench` and the TUI all build one `Workspace` from the same
config and options, so a profile, a `[trim]` section or an `[engine]` setting means the
same thing everywhere. The TUI only draws it and turns its errors into notifications:
every method here returns what went wrong as one line instead of raising.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from phasechat.backends.base import Backend
from phasechat.backends.remote.urls import server_key
from phasechat.chat.config import edit
from phasechat.chat.config.file import Config, EndpointProfile
from phasechat.chat.config.profiles import BackendSpec, make_backend
from phasechat.chat.config.settings import Settings, TrimConfig
from phasechat.chat.config.write import save_config
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore, SavedChat, StoreError
from phasechat.chat.store.writer import ChatWriter, follow
from phasechat.chat.turns import RequestEnded, RequestSent, TurnController, TurnEvent
from phasechat.telemetry import otel

#: why a profile that answers now is not renamed or removed
ACTIVE = "{name} answers now: switch to another backend first"


class Workspace:
    """Profiles and their backends, the turns, the store and the config."""

    def __init__(
        self,
        config: Config,
        active: BackendSpec,
        profiles: Sequence[BackendSpec] = (),
        settings: Settings | None = None,
        backend: Backend | None = None,
    ) -> None:
        """`backend`, when given, is the active profile's backend already built (and
        closed by its owner, not by us); otherwise backends are built on first use.

        With `OTEL_EXPORTER_OTLP_ENDPOINT` set, every request of the chat is traced
        (telemetry/otel.py), and the remote backends built here send its `traceparent`."""
        self.config = config
        self.profiles = {p.name: p for p in [active, *profiles]}
        #: the chat's requests as OpenTelemetry spans and metrics (None: not asked for)
        self.tracing = otel.from_env()
        first = backend or self._make(active)
        self._backends: dict[str, Backend] = {active.name: first}
        self._owned: set[str] = set() if backend is not None else {active.name}
        #: the chat's turns: the one owner of the conversation and its branches
        self.turns = TurnController(first, settings or config.engine)
        self._writer: ChatWriter | None = None
        self.store: ChatStore | None = None
        self.configure_trimmer(self.turns)
        if self.tracing is not None:
            self.turns.subscribe(self._traced)

    # -- backends --------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The backend that answers now."""
        return self.turns.backend

    def built(self, name: str) -> Backend | None:
        """Profile `name`'s backend if it has been built (loaded or not), else None."""
        return self._backends.get(name)

    def backend_for(self, name: str) -> Backend:
        """Profile `name`'s backend, built (not started) on first use."""
        backend = self._backends.get(name)
        if backend is None:
            backend = self._backends[name] = self._make(self.profiles[name])
            self._owned.add(name)
        return backend

    def _make(self, spec: BackendSpec) -> Backend:
        headers = self.tracing.headers if self.tracing is not None else None
        return make_backend(spec, request_headers=headers)

    def switch(self, name: str) -> Backend | None:
        """Answer with profile `name` from the next send on (the conversation carries
        over); None when it is already active or unknown. The caller stops a streaming
        answer first and starts the backend if it is not loaded."""
        if name == self.backend.name or name not in self.profiles:
            return None
        backend = self.backend_for(name)
        self.turns.switch_backend(backend)
        return backend

    # -- profiles in the config file -------------------------------------------------
    def profile_at(self, base_url: str) -> str | None:
        """The name of the remote profile that reaches the same server as `base_url`
        (backends/remote/urls.py `server_key`), if any: adding it again would make a second."""
        key = server_key(base_url)
        remote = ((n, s) for n, s in self.profiles.items() if not s.is_local)
        return next((n for n, s in remote if server_key(s.remote.base_url) == key), None)

    def add_endpoint(self, endpoint: EndpointProfile) -> str | None:
        """Save `endpoint` as the config's last `[[endpoints]]` table and offer it to
        switch to; why not, in one line (then nothing changes)."""
        try:
            config = edit.add_endpoint(self.config, endpoint)
        except ValueError as exc:
            return str(exc)
        error = self.save(config)
        if error is None:
            self.profiles[endpoint.name] = BackendSpec("remote", remote=endpoint.remote_config())
        return error

    async def _edit_profile(self, name: str, change: Callable[[Config], Config]) -> str | None:
        """Save `change` of profile `name` in the config and forget its backend unless it
        answers now (built anew as the profile now says); why not, in one line: it is
        built in, the name is taken, the file cannot be written."""
        try:
            config = change(self.config)
        except ValueError as exc:
            return str(exc)
        error = self.save(config)
        if error is None and name != self.backend.name:
            backend = self._backends.pop(name, None)
            if backend is not None and name in self._owned:
                self._owned.discard(name)
                await backend.aclose()
        return error

    async def remove_profile(self, name: str) -> str | None:
        """Remove profile `name` from the config file and the switcher; why not, in one
        line."""
        if name == self.backend.name:
            return ACTIVE.format(name=name)
        error = await self._edit_profile(name, lambda c: edit.remove_profile(c, name))
        if error is None:
            del self.profiles[name]
            self.configure_trimmer(self.turns)
        return error

    async def rename_profile(self, old: str, new: str) -> str | None:
        """Call profile `old` `new` in the config file and the switcher, where it stands;
        why not, in one line."""
        if old == self.backend.name:
            return ACTIVE.format(name=old)
        error = await self._edit_profile(old, lambda c: edit.rename_profile(c, old, new))
        if error is None:
            spec = self.profiles[old].named(new)
            self.profiles = {
                new if k == old else k: spec if k == old else v for k, v in self.profiles.items()
            }
            self.configure_trimmer(self.turns)
        return error

    async def choose_model(self, name: str, model: str) -> tuple[Backend | None, str | None]:
        """Endpoint `name` asks for `model` from now on (saved in its profile). Returns
        (its new backend when it answers now, to be started; an error in one line).
        The caller stops a streaming answer first."""
        error = await self._edit_profile(name, lambda c: edit.choose_model(c, name, model))
        if error is not None:
            return None, error
        spec = self.profiles[name]
        self.profiles[name] = replace(spec, remote=replace(spec.remote, model=model))
        if name != self.backend.name:
            return None, None
        old = self.backend
        fresh = self._backends[name] = self._make(self.profiles[name])
        self.turns.switch_backend(fresh)
        if name in self._owned:
            await old.aclose()
        self._owned.add(name)
        return fresh, None

    # -- the trimmer -----------------------------------------------------------------
    def configure_trimmer(self, turns: TurnController) -> Backend | None:
        """Set `turns`' trimmer from `[trim]`; its summarizer is a profile's backend by
        name. Returns the summarizer's backend when it still has to be started."""
        trim = self.config.trim
        name = trim.summarizer
        summarizer = self.backend_for(name) if name is not None and name in self.profiles else None
        turns.set_trim(trim.enabled, trim.budget, trim.keep_last, summarizer)
        return summarizer if summarizer is not None and summarizer.state == "idle" else None

    def toggle_trimming(self) -> tuple[bool, str | None]:
        """Turn trimming on or off and save it: (now on, an error saving the config)."""
        trim = replace(self.config.trim, enabled=not self.config.trim.enabled)
        error = self.save(replace(self.config, trim=trim))
        self.configure_trimmer(self.turns)
        return trim.enabled, error

    # -- settings and the config file ------------------------------------------------
    def save(self, config: Config) -> str | None:
        """Write `config` and use it from now on; the error in one line if it failed
        (then nothing changes)."""
        try:
            save_config(config, config.path)
        except OSError as exc:
            return f"config not saved: {exc}"
        self.config = config
        return None

    def apply_settings(
        self, settings: Settings, trim: TrimConfig
    ) -> tuple[Backend | None, str | None]:
        """Use new engine and trimmer settings from the next message on, and save them.

        Returns (a summarizer backend to start, an error saving the config)."""
        self.turns.update_settings(settings)
        error = self.save(replace(self.config, engine=settings, trim=trim))
        if error is not None:  # still used for this session, only not remembered
            self.config = replace(self.config, engine=settings, trim=trim)
        return self.configure_trimmer(self.turns), error

    def remember_theme(self, name: str) -> str | None:
        """Save the chosen theme; the error in one line if it could not be saved."""
        if name == self.config.theme:
            return None
        return self.save(replace(self.config, theme=name))

    # -- saved chats -----------------------------------------------------------------
    def open_store(self, *, readonly: bool = False) -> list[str]:
        """Open the chat database (`readonly`: to read chats, never to write one).
        Returns what the user should read, one line each: why chats cannot be saved
        (then `store` stays None), or that a data file others could read was made private."""
        try:
            self.store = ChatStore(readonly=readonly)
        except (StoreError, sqlite3.Error, OSError) as exc:
            return [f"chats will not be saved: {exc}"]
        return list(self.store.notices)

    def ensure_chat(self) -> str | None:
        """Save the chat from its first message on (a chat is created then).

        Returns why it could not be created (a full disk, a locked database), in one line;
        the next call tries again, and saves the messages sent meanwhile."""
        store = self.store
        if store is None or self._writer is not None:
            return None
        try:
            chat_id = store.create_chat(system=self.turns.conversation.system)
        except sqlite3.Error as exc:
            error = store.failure(exc)
            return f"chat not saved: {error} (retried at the next message; it is kept in memory)"
        self._writer = follow(self.turns, store, chat_id)
        return None

    def _traced(self, event: TurnEvent) -> None:
        """Each request's span (telemetry/otel.py), from the turns' events."""
        tracing = self.tracing
        if tracing is None:
            return
        match event:
            case RequestSent(trace, request, backend):
                tracing.request_sent(trace, request, backend)
            case RequestEnded(trace, metrics):
                tracing.request_ended(trace, metrics)

    def _unfollow(self) -> None:
        if self._writer is not None:
            self.turns.unsubscribe(self._writer)
            self._writer = None

    def retry_save(self) -> bool:
        """Try again the writes that failed; True when nothing is left unsaved."""
        return self._writer is None or self._writer.flush()

    def chat_id(self) -> int | None:
        """The saved chat the conversation is written to, if any."""
        return self._writer.chat_id if self._writer is not None else None

    def row_of(self, message: ChatMessage) -> int | None:
        """The id `message` is saved under (what `chats export` shows), if saved."""
        return self._writer.row_of(message) if self._writer is not None else None

    def saved_rows(self) -> Mapping[int, int] | None:
        """Each saved message's id in the database (`ChatMessage.id` -> row), if saved."""
        return self._writer.rows if self._writer is not None else None

    def open_chat(self, chat_id: int, *, save: bool = True) -> SavedChat:
        """Continue saved chat `chat_id` (the current one stays saved), writing what is
        added to it unless `save` is False; returns it (its `unreadable` cells for the
        user to read). Raises ChatNotFound, or InputError while an answer streams."""
        assert self.store is not None
        saved = self.store.open_chat(chat_id)
        self.turns.replace_conversation(saved.conversation)
        self._unfollow()
        if save:
            self._writer = follow(self.turns, self.store, chat_id, saved.rows)
        return saved

    def new_chat(self) -> Conversation:
        """Start an empty conversation (the current one stays saved); returns it."""
        conversation = Conversation(system=self.turns.settings.system)
        self.turns.replace_conversation(conversation)
        self._unfollow()
        return conversation

    async def aclose(self) -> None:
        """Stop background work, close the backends we built and the store."""
        await self.turns.aclose()
        for name in self._owned:
            await self._backends[name].aclose()
        if self.store is not None:
            self.store.close()
        if self.tracing is not None:  # what is pending goes now, off the event loop
            await asyncio.to_thread(self.tracing.close)
