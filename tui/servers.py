"""The backend switcher (Ctrl+B) and what it does besides switching: a server added by
its URL (or found running here) saved as an `[[endpoints]]` profile and switched to, a
server's model picked, a profile renamed or removed. The workspace changes the config
and its profiles (chat/workspace.py); this module opens the screens and says the result.
"""

from __future__ import annotations

from phasechat.backends.remote.httplog import redact_url
from phasechat.chat.config.edit import free_name
from phasechat.chat.config.file import EndpointProfile
from phasechat.chat.costs import switch_cost
from phasechat.chat.text import one_line
from phasechat.tui.host import ChatHost
from phasechat.tui.screens.confirm import ConfirmScreen
from phasechat.tui.screens.rename_screen import RenameScreen
from phasechat.tui.screens.server_form import ServerChoice, ServerForm
from phasechat.tui.screens.switch_screen import BackendsScreen
from phasechat.tui.widgets.telemetry_view import switch_line


def switch_backend(chat: ChatHost) -> None:
    """Each profile with what switching to it costs; the chosen one answers next."""
    ws = chat.workspace
    rows = [
        (spec, switch_line(switch_cost(ws.turns, name, ws.built(name))))
        for name, spec in ws.profiles.items()
    ]
    remote = {name: spec.remote for name, spec in ws.profiles.items() if not spec.is_local}
    urls = {name: r.base_url for name, r in remote.items()}
    keys = {name: r.api_key_env for name, r in remote.items()}

    async def chosen(name: str | None) -> None:
        if name:
            await chat.switch_to(name)

    def act(verb: str, arg: str) -> None:
        if verb == "add":
            add_server(chat, arg)
        elif verb == "model":
            pick_model(chat, arg)
        elif verb == "rename":
            rename(chat, arg)
        else:
            remove(chat, arg)

    chat.app.push_screen(BackendsScreen(rows, ws.backend.name, act, urls, keys), chosen)


def add_server(chat: ChatHost, url: str = "") -> None:
    """Ask for a server's URL; save the one that answers as a profile and switch to it."""
    ws = chat.workspace

    async def chosen(choice: ServerChoice | None) -> None:
        if choice is None:
            return
        same = ws.profile_at(choice.base_url)
        if same is not None:  # a second profile of one server would split its history
            shown = redact_url(choice.base_url)
            chat.notify(one_line(f"{shown} is already the profile {same}"), markup=False)
            await chat.switch_to(same)
            return
        name = choice.name or free_name(ws.config, choice.said.slug)
        endpoint = EndpointProfile(name, choice.base_url, choice.model, choice.key_env)
        error = ws.add_endpoint(endpoint)
        if error is not None:
            chat.notify(one_line(error), severity="error", markup=False)
            return
        cost = switch_line(switch_cost(ws.turns, name, None))
        where = ws.config.path or "the config"
        chat.notify(
            one_line(f"added {name}: {choice.said.line()} (saved in {where}) · {cost}"),
            markup=False,
            timeout=10,
        )
        await chat.switch_to(name)

    chat.app.push_screen(ServerForm(url), chosen)


def pick_model(chat: ChatHost, name: str) -> None:
    """The models profile `name`'s server lists; the one picked is kept in the profile."""
    ws = chat.workspace
    spec = ws.profiles[name]
    if spec.is_local or ws.config.endpoint(name) is None:
        chat.notify(
            f"{name} is not an [[endpoints]] profile of the config: only a server added"
            " there (a) keeps a model",
            severity="warning",
            markup=False,
        )
        return

    async def chosen(choice: ServerChoice | None) -> None:
        if choice is None or choice.model is None:
            return
        if name == ws.backend.name and chat.refused_while_answering():
            return
        fresh, error = await ws.choose_model(name, choice.model)
        if error is not None:
            chat.notify(one_line(error), severity="error", markup=False)
            return
        chat.notify(one_line(f"{name} asks for {choice.model} from now on (saved)"), markup=False)
        if fresh is not None:
            chat.reload_backend()

    remote = spec.remote
    chat.app.push_screen(ServerForm(remote.base_url, remote.api_key_env, pick_only=True), chosen)


def rename(chat: ChatHost, name: str) -> None:
    """A new name for profile `name`, in the config file and the switcher."""

    async def chosen(new: str | None) -> None:
        if new is None:
            return
        error = await chat.workspace.rename_profile(name, new)
        if error is not None:
            chat.notify(one_line(error), severity="error", markup=False)
        else:
            chat.notify(one_line(f"{name} is now called {new} (saved)"), markup=False)

    chat.app.push_screen(RenameScreen(f"Rename the profile {name} to:", name), chosen)


def remove(chat: ChatHost, name: str) -> None:
    """Remove profile `name` from the config file and the switcher, once confirmed."""

    async def chosen(yes: bool | None) -> None:
        if not yes:
            return
        error = await chat.workspace.remove_profile(name)
        if error is not None:
            chat.notify(one_line(error), severity="error", markup=False)
        else:
            chat.notify(one_line(f"removed {name} from the config"), markup=False)

    question = f"Remove the profile {name} from the config file?"
    chat.app.push_screen(
        ConfirmScreen(question, "Its table goes; the rest of the file stays."), chosen
    )
