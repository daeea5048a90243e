"""Add a server by its URL, or pick one's model: the URL (and the name of the variable
that holds its key, never the key), asked at once off the UI thread; what it answered in
one line (its family, models and window, or why not); a list to pick from where it
serves several models."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from phasechat.backends.remote.probe import Probe, base_url_of, probe
from phasechat.chat.text import one_line

#: What an environment variable's name may be (a pasted key is refused, never kept).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
DEFAULT_KEY_ENV = "OPENAI_API_KEY"


@dataclass(frozen=True, slots=True)
class ServerChoice:
    """A server that answered, as the user chose it."""

    base_url: str
    key_env: str  # the variable's name
    name: str  # "" for a name made from the server's family
    model: str | None  # None: the one it lists
    said: Probe


class ServerForm(ModalScreen[ServerChoice | None]):
    """Enter asks the server; one that lists one model is taken at once, one that lists
    several shows them to pick from. `pick_only`: a profile's server, asked for its
    models (the URL and key variable are the profile's)."""

    DEFAULT_CSS = """
    ServerForm { align: center middle; }
    ServerForm > Vertical { width: 90; height: auto; max-height: 90%;
        background: $surface; border: thick $primary; padding: 0 1; }
    ServerForm Input { margin: 0 0 0 0; }
    ServerForm #said { margin: 1 0 0 0; }
    ServerForm OptionList { height: auto; max-height: 12; display: none; }
    ServerForm OptionList.shown { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="server-cancel")
    ]

    def __init__(self, url: str = "", key_env: str = "", *, pick_only: bool = False) -> None:
        super().__init__()
        self.url, self.key_env, self.pick_only = url, key_env, pick_only
        #: what the server answered last (None: not asked yet)
        self.said: Probe | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            heading = "Pick a model" if self.pick_only else "Add a server"
            note = "  (saved as an [[endpoints]] profile, then switched to)"
            yield Static(Content.assemble((heading, "bold"), ("" if self.pick_only else note)))
            yield Input(self.url, placeholder="URL: http://127.0.0.1:8080 (/v1 is added)", id="url")
            yield Input(
                self.key_env,
                placeholder=f"the NAME of the variable that holds its key ({DEFAULT_KEY_ENV});"
                " never the key",
                id="key-env",
            )
            yield Input(placeholder="the profile's name (default: the server's kind)", id="name")
            yield Static(
                Content.styled("Enter asks the server what it is", "dim"), id="said", markup=False
            )
            yield OptionList(id="models")
            yield Footer()

    def on_mount(self) -> None:
        if self.pick_only:
            for field in ("#url", "#key-env", "#name"):
                self.query_one(field, Input).disabled = True
        self.query_one("#url", Input).focus()
        if self.url:
            self.ask()

    @on(Input.Submitted)
    def submitted(self) -> None:
        self.ask()

    @on(Input.Changed, "#key-env")
    def key_env_changed(self) -> None:
        if (note := self._key_note()) is not None:
            self._say(note, "$warning")

    def _key_note(self) -> str | None:
        """ "$VAR is not set: ..." when the variable named for the key is not in the
        environment (only whether it is set is read, never its value); None otherwise,
        or when no name was given (most servers on this machine want no key)."""
        given = self.query_one("#key-env", Input).value.strip()
        if not given or not ENV_NAME.fullmatch(given) or given in os.environ:
            return None
        if self.pick_only and given == DEFAULT_KEY_ENV:
            return None  # the profile names none of its own
        return f"${given} is not set: the server will get no key"

    def _said_with_note(self, text: str) -> str:
        note = self._key_note()
        return text if note is None else f"{text} · {note}"

    def _say(self, text: str, style: str = "") -> None:
        self.query_one("#said", Static).update(Content.styled(one_line(text), style))

    @work(exclusive=True, group="probe")
    async def ask(self) -> None:
        """Ask the server in the form; take it, offer its models, or say why not."""
        key_input = self.query_one("#key-env", Input)
        key_env = key_input.value.strip() or DEFAULT_KEY_ENV
        if not ENV_NAME.fullmatch(key_env):
            key_input.value = ""  # a pasted key does not stay on screen
            self._say(
                "not a variable's name: the key stays in the environment; name the variable"
                " that holds it (e.g. LAB_API_KEY)",
                "$error",
            )
            return
        try:
            url = base_url_of(self.query_one("#url", Input).value)
        except ValueError as exc:
            self._say(str(exc), "$error")
            return
        self._say(self._said_with_note(f"asking {url} ..."), "dim")
        said = self.said = await probe(url, key_env)
        if not said.ok:
            self._say(self._said_with_note(said.line()), "$error")
            return
        self._say(self._said_with_note(said.line()))
        name = self.query_one("#name", Input).value.strip()
        if len(said.models) == 1 and not self.pick_only:
            self.dismiss(ServerChoice(url, key_env, name, None, said))
            return
        models = self.query_one("#models", OptionList)
        models.clear_options()
        # by place, not by id: a listing may name a model twice (ids must be unique)
        models.add_options(Option(Content(one_line(m))) for m in said.models)
        models.add_class("shown")
        models.highlighted = 0
        models.focus()
        self._say(self._said_with_note(f"{said.line()}: pick one (Enter)"))

    @on(OptionList.OptionSelected, "#models")
    def picked(self, event: OptionList.OptionSelected) -> None:
        said = self.said
        if said is None or not 0 <= event.option_index < len(said.models):
            return
        model = said.models[event.option_index]
        key_env = self.query_one("#key-env", Input).value.strip() or DEFAULT_KEY_ENV
        name = self.query_one("#name", Input).value.strip()
        self.dismiss(ServerChoice(said.base_url, key_env, name, model, said))

    def action_cancel(self) -> None:
        self.dismiss(None)
