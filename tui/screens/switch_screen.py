"""Choose the backend that answers next, seeing first what the switch will cost."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from phasechat.backends.remote.probe import Probe, find_local
from phasechat.backends.remote.urls import server_key
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.text import one_line


class SwitchScreen(ModalScreen[str | None]):
    """Lists backend profiles with the history's size there and the re-prefill cost."""

    DEFAULT_CSS = """
    SwitchScreen { align: center middle; }
    SwitchScreen > Vertical { width: 90; height: auto; max-height: 80%;
        background: $surface; border: thick $primary; padding: 0 1; }
    SwitchScreen OptionList { height: auto; max-height: 20; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Cancel", id="switch-cancel")
    ]

    def __init__(
        self,
        profiles: list[tuple[BackendSpec, str]],
        current: str,
        title: tuple[str, str] = ("Switch backend", "  (the chat carries over)"),
    ) -> None:
        """`profiles`: each spec with a one-line cost note computed by the app; `title`:
        the heading and a note after it (the compare picker has its own)."""
        super().__init__()
        self.profiles = profiles
        self.current = current
        self.title_parts = title

    def compose(self) -> ComposeResult:
        with Vertical():
            heading, note = self.title_parts
            yield Static(Content.assemble((heading, "bold"), note))
            options = []
            for spec, cost in self.profiles:
                mark = "● " if spec.name == self.current else "  "
                label = Content.assemble(
                    (f"{mark}{one_line(spec.name)}", "bold"),
                    f"  {one_line(spec.describe)}\n    ",
                    (cost, "dim"),
                )
                options.append(Option(label, id=spec.name))
            yield OptionList(*options)
            yield from self.compose_more()

    def compose_more(self) -> ComposeResult:
        """What a screen built on this one shows under the list."""
        yield from ()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.choose(event.option.id or "")

    def choose(self, chosen: str) -> None:
        """The option `chosen` (its id) was selected. A screen built on this one
        overrides this, not the handler: Textual calls each class's handler in turn."""
        self.dismiss(chosen)


#: What the backend switcher asks the app to do besides switching: ("add", a URL or ""),
#: ("model" | "rename" | "remove", a profile's name).
Act = Callable[[str, str], None]
ADD = "+add"  # option ids that are not a profile's name start with "+"
FOUND = "+found "
PROFILE = "+is "


class BackendsScreen(SwitchScreen):
    """The backend switcher (Ctrl+B): the profiles with their cost, "add a server", and
    the servers found running on this machine (looked for when it opens, off the UI
    thread, on loopback only); keys to pick a server's model, rename or remove a profile."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "act('add')", "Add a server", id="switch-add"),
        Binding("m", "act('model')", "Model", id="switch-model"),
        Binding("r", "act('rename')", "Rename", id="switch-rename"),
        Binding("d,delete", "act('remove')", "Remove", id="switch-remove"),
    ]

    def __init__(
        self,
        profiles: list[tuple[BackendSpec, str]],
        current: str,
        act: Act,
        local_urls: dict[str, str],
        key_envs: dict[str, str] | None = None,
    ) -> None:
        """`act(verb, arg)`: what the app does when a key here asks for more than a
        switch (the screen is closed first); `local_urls`: each remote profile's URL
        by its name (their loopback ports are looked at too; a server found at one is
        offered as that profile); `key_envs`: the variable holding each remote profile's
        key, by its name (its port is asked with that key, as a switch would ask)."""
        super().__init__(profiles, current)
        self.act = act
        self.local_urls = local_urls
        self.key_envs = key_envs or {}
        #: the servers found on this machine (None: still looking)
        self.found: list[Probe] | None = None

    def compose_more(self) -> ComposeResult:
        yield Static(Content.styled("looking for servers on this machine ...", "dim"), id="found")
        yield Footer()

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.add_option(Option(Content.styled("+ add a server by its URL ...", "bold"), id=ADD))
        options.focus()
        self.look_here()

    @work(exclusive=True, group="find-local")
    async def look_here(self) -> None:
        urls, envs = self.local_urls, self.key_envs
        keys = {url: envs[name] for name, url in urls.items() if name in envs}
        self.found = await find_local(urls.values(), key_envs=keys)
        options = self.query_one(OptionList)
        for p in self.found:
            profile = self._profile_at(p.base_url)
            if p.ok:
                said = f"{p.line()} · :{p.port}"
            else:
                why = "needs a key" if p.needs_key else "not ready"
                said = f":{p.port} answers, {why}: {p.line()}"
            if profile is not None:  # selecting it switches to that profile
                said += f" (the profile {profile})"
            label = Content.assemble(("found here: ", "bold"), one_line(said))
            chosen = PROFILE + profile if profile is not None else FOUND + p.base_url
            options.add_option(Option(label, id=chosen))
        said = "" if self.found else "no server answers on this machine's usual ports"
        self.query_one("#found", Static).update(Content.styled(said, "dim"))

    def _profile_at(self, base_url: str) -> str | None:
        """The profile whose URL is `base_url` (on 127.0.0.1 or localhost), if any."""
        key = server_key(base_url)
        return next((n for n, url in self.local_urls.items() if server_key(url) == key), None)

    def choose(self, chosen: str) -> None:
        if chosen == ADD:
            self._close_and("add", "")
        elif chosen.startswith(FOUND):
            self._close_and("add", chosen.removeprefix(FOUND))
        elif chosen.startswith(PROFILE):
            self.dismiss(chosen.removeprefix(PROFILE))
        else:
            self.dismiss(chosen)

    def _highlighted(self) -> str | None:
        options = self.query_one(OptionList)
        index = options.highlighted
        if index is None:
            return None
        chosen = options.get_option_at_index(index).id
        return None if chosen is None or chosen.startswith("+") else chosen

    def action_act(self, verb: str) -> None:
        if verb == "add":
            self._close_and("add", "")
            return
        name = self._highlighted()
        if name is None:
            self.notify("select a profile first", severity="warning")
            return
        self._close_and(verb, name)

    def _close_and(self, verb: str, arg: str) -> None:
        self.dismiss(None)
        self.act(verb, arg)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
