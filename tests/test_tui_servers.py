"""Toggling to any server from the chat (Ctrl+B): one added by its URL, saved as an
`[[endpoints]]` profile and switched to with the chat carried over; a dead URL and a web
page each said in one line; a server with two models, one picked and kept; a profile
renamed and removed. Through the real app (Pilot), a real llama-server started by the
test, and the scripted fault server for the two-model and web-page servers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, OptionList, Static

from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote import probe as probe_module
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.file import Config, EndpointProfile, load_config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.workspace import ACTIVE
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.confirm import ConfirmScreen
from phasechat.tui.screens.rename_screen import RenameScreen
from phasechat.tui.screens.server_form import ServerForm
from phasechat.tui.screens.switch_screen import ADD, PROFILE, BackendsScreen
from tests.fault_server import FaultServer, fault_server_thread
from tests.helpers import settled, wait_for
from tests.llama_server import free_port
from tests.locked_server import KEY, MODEL, locked_server

WRITTEN = """\
# my own notes, kept
theme = "phasechat-dark"
[engine]
max_tokens = 8  # short answers
"""


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with fault_server_thread() as s:
        yield s


@pytest.fixture
def config(tmp_path: Path) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(WRITTEN)
    return load_config(path)


def said(app: PhasechatApp) -> str:
    return str(app.screen.query_one("#said", Static).render())


async def open_form(pilot: Pilot[None], app: PhasechatApp, url: str) -> ServerForm:
    """Ctrl+B, `a`, the URL typed and Enter: the form, asking."""
    await pilot.press("ctrl+b")
    await wait_for(pilot, lambda: isinstance(app.screen, BackendsScreen))
    await pilot.press("a")
    await wait_for(pilot, lambda: isinstance(app.screen, ServerForm))
    form = app.screen
    assert isinstance(form, ServerForm)
    form.query_one("#url", Input).value = url
    await pilot.press("enter")
    return form


@contextlib.asynccontextmanager
async def ready(app: PhasechatApp) -> AsyncIterator[Pilot[None]]:
    """The app running at 120x40, its backend started."""
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.backend.state == "ready")
        yield pilot


async def in_switcher(pilot: Pilot[None], app: PhasechatApp, option: str, key: str) -> None:
    """Ctrl+B, the option with id `option` highlighted, then `key`."""
    await pilot.press("ctrl+b")
    await wait_for(pilot, lambda: isinstance(app.screen, BackendsScreen))
    options = app.screen.query_one(OptionList)
    options.highlighted = options.get_option_index(option)
    await pilot.press(key)


def fault_app(server: FaultServer, config: Config, *profiles: BackendSpec) -> PhasechatApp:
    spec = BackendSpec("openai", remote=RemoteConfig(server.base_url, "ok-3", name="first"))
    return PhasechatApp(spec, Settings(max_tokens=8), profiles=profiles, config=config)


async def test_enter_in_the_switcher_switches_adds_and_names_what_runs_here(
    server: FaultServer, config: Config
) -> None:
    second = BackendSpec("openai", remote=RemoteConfig(server.base_url, "ok-3", name="second"))
    app = fault_app(server, config, second)
    async with ready(app) as pilot:
        await pilot.press("ctrl+b")
        screen = app.screen
        assert isinstance(screen, BackendsScreen)
        await wait_for(pilot, lambda: screen.found is not None)
        options = screen.query_one(OptionList)
        ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
        # the fault server answers at the profiles' own port: offered as the first of them
        assert ids[:3] == ["first", "second", ADD] and f"{PROFILE}first" in ids[3:]
        options.highlighted = 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.backend.name == "second")
        assert not isinstance(app.screen, BackendsScreen)
        await in_switcher(pilot, app, ADD, "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ServerForm))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ServerForm))
        assert app.backend.name == "second"


async def test_a_dead_url_and_a_web_page_are_each_one_line_and_nothing_saved(
    server: FaultServer, config: Config
) -> None:
    app = fault_app(server, config)
    async with ready(app) as pilot:
        form = await open_form(pilot, app, f"127.0.0.1:{free_port()}")
        await wait_for(pilot, lambda: "connection refused" in said(app))
        assert app.screen is form  # still there, to correct the URL
        form.query_one("#url", Input).value = server.base_url.replace("/v1", "/html/v1")
        form.query_one("#url", Input).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: "no model list" in said(app))
        assert "\n" not in said(app).strip()
        # a key pasted where the variable's name goes is refused and cleared
        form.query_one("#key-env", Input).value = "sk-live secret key"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "not a variable's name" in said(app))
        assert form.query_one("#key-env", Input).value == ""
        await pilot.press("escape")
    assert config.path is not None and config.path.read_text() == WRITTEN
    assert list(app.workspace.profiles) == ["first"]


async def test_two_models_one_picked_kept_in_the_profile_and_answering(
    server: FaultServer, config: Config
) -> None:
    app = fault_app(server, config)
    async with ready(app) as pilot:
        app.chat.send("hello")
        await settled(pilot, app, 1)
        await open_form(pilot, app, server.base_url.replace("/v1", "/two-models/v1"))
        models = app.screen.query_one("#models", OptionList)
        await wait_for(pilot, lambda: models.option_count == 2)
        assert "2 models" in said(app) and "pick one" in said(app)
        await pilot.press("down", "enter")  # the second: ok-7
        await wait_for(pilot, lambda: app.backend.name != "first")
        name = app.backend.name
        assert name.startswith("127.0.0.1-") and app.backend.model == "ok-7"
        app.chat.send("and again")
        await settled(pilot, app, 2)
        assert server.requests[-1]["model"] == "ok-7"
        # the chat carried over: the first answer went with the second question
        sent = [(m["role"], m["content"]) for m in server.requests[-1]["messages"]]
        assert sent[1:] == [("user", "hello"), ("assistant", "tok tok tok "), ("user", "and again")]
        assert app.turns.exchanges[1].answer.backend == name
    assert config.path is not None
    saved = load_config(config.path)
    assert [(e.name, e.model) for e in saved.endpoints] == [(name, "ok-7")]
    assert config.path.read_text().startswith(WRITTEN)


async def test_a_hostile_model_list_is_drawn_as_text_and_picked_by_place(
    server: FaultServer, config: Config
) -> None:
    app = fault_app(server, config)
    async with ready(app) as pilot:
        await open_form(pilot, app, server.base_url.replace("/v1", "/hostile-models/v1"))
        models = app.screen.query_one("#models", OptionList)
        await wait_for(pilot, lambda: models.option_count == 3)  # ok-3 twice: no clash
        shown = str(models.get_option_at_index(1).prompt)
        assert "[/]" in shown and "\x1b" not in shown  # the markup as text, no escape
        await pilot.press("down", "down", "enter")
        await wait_for(pilot, lambda: app.backend.name != "first")
        assert app.backend.model == "ok-3"


async def test_model_picked_again_rename_and_remove_from_the_switcher(
    server: FaultServer, config: Config
) -> None:
    url = server.base_url.replace("/v1", "/two-models/v1")
    app = fault_app(server, config)
    assert app.workspace.add_endpoint(EndpointProfile("two", url)) is None
    path = config.path
    assert path is not None
    async with ready(app) as pilot:
        await in_switcher(pilot, app, "two", "m")
        await wait_for(pilot, lambda: isinstance(app.screen, ServerForm))
        models = app.screen.query_one("#models", OptionList)
        await wait_for(pilot, lambda: models.option_count == 2)
        await pilot.press("enter")  # ok-3
        await wait_for(pilot, lambda: app.workspace.profiles["two"].remote.model == "ok-3")
        assert [e.model for e in load_config(path).endpoints] == ["ok-3"]
        await in_switcher(pilot, app, "two", "r")
        await wait_for(pilot, lambda: isinstance(app.screen, RenameScreen))
        app.screen.query_one(Input).value = "lab"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "lab" in app.workspace.profiles)
        assert [e.name for e in load_config(path).endpoints] == ["lab"]
        await in_switcher(pilot, app, "lab", "d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: "lab" not in app.workspace.profiles)
        # the profile that answers is neither renamed nor removed
        refused = ACTIVE.format(name="first")
        assert await app.workspace.rename_profile("first", "x") == refused
        assert await app.workspace.remove_profile("first") == refused
    assert load_config(path).endpoints == ()
    assert path.read_text().startswith(WRITTEN)


@pytest.mark.model
@pytest.mark.server
async def test_from_a_local_answer_to_a_llama_server_added_by_its_url(
    local_backend: LocalBackend,
    start_llama_server: Callable[..., str],
    config: Config,
) -> None:
    app = PhasechatApp(
        settings=Settings(max_tokens=8, temperature=0), backend=local_backend, config=config
    )
    async with app.run_test(size=(120, 40)) as pilot:
        app.chat.send("Hello there")
        await settled(pilot, app, 1)
        url = start_llama_server()  # a server started after the app
        await open_form(pilot, app, url.removesuffix("/v1"))  # /v1 is added
        await wait_for(pilot, lambda: app.backend.name == "llama-server")
        await wait_for(pilot, lambda: app.backend.state == "ready")
        app.chat.send("And again?")
        await settled(pilot, app, 2)
        second = app.turns.exchanges[1]
        assert second.answer.backend == "llama-server" and second.answer.status == "complete"
        assert second.request is not None
        assert any(
            m.content == app.turns.exchanges[0].answer.content for m in second.request.messages
        )
        # found here: the profile's own loopback port is looked at, and named
        await pilot.press("ctrl+b")
        screen = app.screen
        assert isinstance(screen, BackendsScreen)
        await wait_for(pilot, lambda: screen.found is not None)
        assert screen.found is not None
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        here = [p for p in screen.found if p.port == port]
        assert here and here[0].family == "llama-server"
        assert "· SmolLM2-135M-Instruct.Q4_1 · window" in here[0].line()
    assert config.path is not None
    saved = load_config(config.path)
    assert [(e.name, e.base_url, e.model) for e in saved.endpoints] == [("llama-server", url, None)]
    assert config.path.read_text().startswith(WRITTEN)


def notes(app: PhasechatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_a_url_that_is_a_profile_already_switches_to_it_and_adds_none(
    server: FaultServer, config: Config
) -> None:
    # the profile's spelling and the one typed differ: localhost, a final "/" and "/v1"
    lab_url = f"http://localhost:{server.port}/two-models/v1/"
    app = fault_app(server, config)
    assert app.workspace.add_endpoint(EndpointProfile("lab", lab_url)) is None
    assert config.path is not None
    before = config.path.read_text()
    async with ready(app) as pilot:
        await open_form(pilot, app, f"127.0.0.1:{server.port}/two-models")
        models = app.screen.query_one("#models", OptionList)
        await wait_for(pilot, lambda: models.option_count == 2)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.backend.name == "lab")
        assert any("is already the profile lab" in n for n in notes(app))
        assert list(app.workspace.profiles) == ["first", "lab"]
    assert config.path.read_text() == before  # no "127.0.0.1-PORT" table added


async def test_a_new_model_for_the_profile_that_answers_restarts_it_and_the_chat_goes_on(
    server: FaultServer, config: Config
) -> None:
    url = server.base_url.replace("/v1", "/two-models/v1")
    app = fault_app(server, config)
    assert app.workspace.add_endpoint(EndpointProfile("two", url)) is None
    async with ready(app) as pilot:
        await app.chat.switch_to("two")
        await wait_for(pilot, lambda: app.backend.name == "two" and app.backend.state == "ready")
        app.chat.send("hello")
        await settled(pilot, app, 1)
        assert server.requests[-1]["model"] == "ok-3"  # the first it lists
        old = app.backend
        await in_switcher(pilot, app, "two", "m")
        await wait_for(pilot, lambda: isinstance(app.screen, ServerForm))
        models = app.screen.query_one("#models", OptionList)
        await wait_for(pilot, lambda: models.option_count == 2)
        await pilot.press("down", "enter")  # ok-7
        await wait_for(pilot, lambda: app.backend is not old and app.backend.state == "ready")
        assert app.backend.name == "two" and app.backend.model == "ok-7"
        app.chat.send("and again")
        await settled(pilot, app, 2)
        assert server.requests[-1]["model"] == "ok-7"
        sent = [(m["role"], m["content"]) for m in server.requests[-1]["messages"]]
        assert sent[1:] == [("user", "hello"), ("assistant", "tok tok tok "), ("user", "and again")]
        assert [x.answer.backend for x in app.turns.exchanges] == ["two", "two"]
    assert config.path is not None
    assert [(e.name, e.model) for e in load_config(config.path).endpoints] == [("two", "ok-7")]


async def test_a_key_variable_that_is_not_set_is_said_in_the_form_never_a_value(
    server: FaultServer, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PHASECHAT_TEST_LAB_KEY", raising=False)
    monkeypatch.setenv("PHASECHAT_TEST_SET_KEY", "sk-test-secret-value-1234")
    app = fault_app(server, config)
    async with ready(app) as pilot:
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: isinstance(app.screen, BackendsScreen))
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ServerForm))
        form = app.screen
        key_env = form.query_one("#key-env", Input)
        key_env.value = "PHASECHAT_TEST_LAB_KEY"
        unset = "$PHASECHAT_TEST_LAB_KEY is not set: the server will get no key"
        await wait_for(pilot, lambda: unset in said(app))
        # asked: the answer's line keeps saying it
        form.query_one("#url", Input).value = server.base_url.replace("/v1", "/two-models/v1")
        form.query_one("#url", Input).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: "pick one" in said(app))
        assert unset in said(app)
        # a variable that is set: nothing said of it, its value never shown
        key_env.value = "PHASECHAT_TEST_SET_KEY"
        form.query_one("#url", Input).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: "pick one" in said(app))
        assert "not set" not in said(app) and "sk-test" not in said(app)
        await pilot.press("escape")


async def found_labels(pilot: Pilot[None], app: PhasechatApp) -> dict[str, str]:
    """Ctrl+B; once the search is done, each found server's option: its id and label."""
    await pilot.press("ctrl+b")
    screen = app.screen
    assert isinstance(screen, BackendsScreen)
    await wait_for(pilot, lambda: screen.found is not None)
    options = screen.query_one(OptionList)
    found = (options.get_option_at_index(i) for i in range(options.option_count))
    labels = {o.id or "": str(o.prompt) for o in found if "found here" in str(o.prompt)}
    await pilot.press("escape")
    await wait_for(pilot, lambda: not isinstance(app.screen, BackendsScreen))
    return labels


async def test_found_here_a_profiles_port_answers_to_its_key_another_needs_one(
    server: FaultServer, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKED_KEY", KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with locked_server() as port:
        monkeypatch.setattr(probe_module, "USUAL_PORTS", {port: "vLLM"})
        app = fault_app(server, config)
        async with ready(app) as pilot:
            labels = await found_labels(pilot, app)
            (label,) = [v for v in labels.values() if f":{port}" in v]
            assert f":{port} answers, needs a key: " in label and "not ready" not in label
            url = f"http://127.0.0.1:{port}/v1"
            profile = EndpointProfile("locked", url, api_key_env="LOCKED_KEY")
            assert app.workspace.add_endpoint(profile) is None
            labels = await found_labels(pilot, app)
            assert MODEL in labels[f"{PROFILE}locked"] and KEY not in labels[f"{PROFILE}locked"]
