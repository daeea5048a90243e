"""Servers added, found and removed without the UI: the config's profiles edited in the
user's own file (comments and order kept), a server probed (a dead URL, a web page, two
models, over real HTTP on 127.0.0.1), and `phasechat endpoints add/list/remove`."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from phasechat.backends.remote import probe as probe_module
from phasechat.backends.remote.probe import (
    USUAL_PORTS,
    base_url_of,
    find_local,
    local_urls,
    probe,
    shown_model,
)
from phasechat.backends.remote.urls import server_key
from phasechat.chat.config import edit
from phasechat.chat.config.file import EndpointProfile, load_config
from phasechat.chat.config.write import save_config
from phasechat.cli.main import main
from tests.fault_server import FaultServer, fault_server_thread
from tests.llama_server import free_port
from tests.locked_server import KEY, locked_server

WRITTEN = """\
# my own notes, kept
theme = "phasechat-dark"

# the lab box
[[endpoints]]
name = "lab"  # the big one
base_url = "http://127.0.0.1:9/v1"  # nothing listens here
api_key_env = "LAB_KEY"

[[local]]
name = "gemma"
path = "gemma3"

[engine]
temperature = 0.5  # warm
"""


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with fault_server_thread() as s:
        yield s


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(WRITTEN)
    return path


def test_an_endpoint_added_is_one_table_more_and_the_rest_stays(config_file: Path) -> None:
    config = load_config(config_file)
    added = EndpointProfile("here", "http://127.0.0.1:8080/v1", model="m", api_key_env="HK")
    save_config(edit.add_endpoint(config, added), config_file)
    text = config_file.read_text()
    assert text.startswith(WRITTEN.split("[[local]]")[0])  # the lab table, comments and all
    assert '# the lab box\n[[endpoints]]\nname = "lab"  # the big one' in text
    assert "temperature = 0.5  # warm" in text
    assert load_config(config_file).endpoints[-1] == added
    # the rest of the file reads as before
    assert load_config(config_file).local == config.local


def test_rename_remove_and_model_edit_the_table_where_it_stands(config_file: Path) -> None:
    config = load_config(config_file)
    save_config(edit.rename_profile(config, "lab", "lab2"), config_file)
    text = config_file.read_text()
    assert 'name = "lab2"' in text and "# the lab box" in text and "# my own notes" in text
    config = load_config(config_file)
    save_config(edit.choose_model(config, "lab2", "qwen"), config_file)
    assert load_config(config_file).endpoints[0].model == "qwen"
    assert 'api_key_env = "LAB_KEY"' in config_file.read_text()
    save_config(edit.remove_profile(load_config(config_file), "gemma"), config_file)
    after = load_config(config_file)
    assert [e.name for e in after.endpoints] == ["lab2"] and after.local == ()
    assert "temperature = 0.5  # warm" in config_file.read_text()


@pytest.mark.parametrize(
    ("name", "why"),
    [("lab", "exists already"), ("local", "built-in"), ("a b", "bad profile name"), ("", "bad")],
)
def test_a_name_taken_built_in_or_untypeable_is_refused(
    config_file: Path, name: str, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        edit.add_endpoint(load_config(config_file), EndpointProfile(name, "http://h/v1"))


def test_built_in_profiles_are_not_in_the_file_to_remove(config_file: Path) -> None:
    with pytest.raises(ValueError, match="built in"):
        edit.remove_profile(load_config(config_file), "openai")


def test_free_name_counts_up(config_file: Path) -> None:
    config = load_config(config_file)
    assert edit.free_name(config, "llama-server") == "llama-server"
    assert edit.free_name(config, "lab") == "lab-2"
    assert edit.free_name(config, "local") == "local-2"


@pytest.mark.parametrize(
    ("typed", "url"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
        ("http://box:8000/", "http://box:8000/v1"),
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("http://h/api/v2", "http://h/api/v2"),
    ],
)
def test_a_typed_url_becomes_a_base_url(typed: str, url: str) -> None:
    assert base_url_of(typed) == url


@pytest.mark.parametrize("typed", ["", "ftp://h", "http://h:99999", "http://h\r\nX-A: b"])
def test_a_url_no_request_could_go_to_is_refused(typed: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        base_url_of(typed)


@pytest.mark.parametrize(
    ("listed", "shown"),
    [
        ("/models/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"),
        ("qwen2.5:7b", "qwen2.5:7b"),
        ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ],
)
def test_a_gguf_path_is_shown_by_its_file_name(listed: str, shown: str) -> None:
    assert shown_model(listed) == shown


def test_only_loopback_is_looked_at() -> None:
    urls = local_urls(["http://10.0.0.5:9000/v1", "http://localhost:28090/v1", "http://h:7/v1"])
    assert urls[: len(USUAL_PORTS)] == [f"http://127.0.0.1:{p}/v1" for p in USUAL_PORTS]
    assert urls[len(USUAL_PORTS) :] == ["http://127.0.0.1:28090/v1"]
    assert all(u.startswith("http://127.0.0.1:") for u in urls)


class Loading(http.server.BaseHTTPRequestHandler):
    """What llama-server answers every request while it loads its model (tools/server/
    server.cpp: 503, `{"error": {"code": 503, "message": "Loading model", ...}}`)."""

    def do_GET(self) -> None:
        body = b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_found_here_are_those_that_answer_http_even_a_refusal(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe_module, "USUAL_PORTS", {})  # not what runs on this machine
    loading = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loading)
    threading.Thread(target=loading.serve_forever, daemon=True).start()
    try:
        urls = [server.base_url, f"http://localhost:{loading.server_port}/v1"]
        found = await find_local([*urls, f"http://127.0.0.1:{free_port()}/v1"])
    finally:
        loading.shutdown()
    by_port = {p.port: p for p in found}
    assert set(by_port) == {server.port, loading.server_port}  # the dead port left out
    assert by_port[server.port].ok and by_port[server.port].models == ("scripted",)
    busy = by_port[loading.server_port]
    assert not busy.ok and busy.status == 503 and "Loading model" in busy.line()


async def test_a_dead_url_says_refused() -> None:
    said = await probe(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2)
    assert not said.ok
    assert "connection refused" in said.line()


async def test_a_web_page_says_it_is_not_an_api(server: FaultServer) -> None:
    said = await probe(server.base_url.replace("/v1", "/html/v1"))
    assert not said.ok and "no model list" in said.line()


async def test_a_server_with_two_models_lists_both(server: FaultServer) -> None:
    said = await probe(server.base_url.replace("/v1", "/two-models/v1"))
    assert said.ok and said.models == ("ok-3", "ok-7")
    assert said.family == "OpenAI-compatible" and said.line().endswith("window not said")
    assert said.slug == f"127.0.0.1-{server.port}"


def test_cli_add_list_remove(
    server: FaultServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(WRITTEN)
    url = server.base_url.replace("/v1", "/two-models/v1")
    assert main(["--config", str(path), "endpoints", "add", url, "--pick", "ok-7"]) == 0
    out = capsys.readouterr().out
    assert "added 127.0.0.1-" in out and "2 models" in out
    added = load_config(path).endpoints[-1]
    assert added.model == "ok-7" and added.base_url == url
    assert "# the lab box" in path.read_text()
    assert main(["--config", str(path), "endpoints", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{added.name}  {url} · ok-7" in out
    assert "now: cannot connect to http://127.0.0.1:9/v1: connection refused" in out
    assert "now: OpenAI-compatible · 2 models" in out
    assert main(["--config", str(path), "endpoints", "remove", added.name]) == 0
    assert [e.name for e in load_config(path).endpoints] == ["lab"]
    assert main(["--config", str(path), "endpoints", "remove", "nope"]) == 2
    assert "no profile called 'nope'" in capsys.readouterr().err


def test_cli_add_of_a_dead_url_saves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    assert main(["--config", str(path), "endpoints", "add", f"127.0.0.1:{free_port()}"]) == 1
    assert "connection refused" in capsys.readouterr().err
    assert not path.exists()


def test_cli_refuses_a_model_the_server_does_not_list(
    server: FaultServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    url = server.base_url.replace("/v1", "/two-models/v1")
    assert main(["--config", str(path), "endpoints", "add", url, "--pick", "nope"]) == 2
    assert "does not list 'nope'" in capsys.readouterr().err and not path.exists()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://127.0.0.1:8080/v1", "http://localhost:8080"),
        ("http://127.0.0.1:8080/v1", "HTTP://127.0.0.1:8080/v1/"),
        ("https://API.example.com/v1", "https://api.example.com:443/"),
        ("http://h/openai/v1?api-version=1", "http://h:80/openai?api-version=1"),
    ],
)
def test_one_server_however_its_url_is_written(a: str, b: str) -> None:
    assert server_key(a) == server_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://127.0.0.1:8080/v1", "https://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8081/v1"),
        ("http://h/two-models/v1", "http://h/v1"),
        ("http://h/openai/v1?api-version=1", "http://h/openai/v1?api-version=2"),
    ],
)
def test_another_server_is_another(a: str, b: str) -> None:
    assert server_key(a) != server_key(b)


def test_cli_add_of_a_server_that_is_a_profile_already_is_refused_naming_it(
    server: FaultServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "c.toml"
    url = server.base_url.replace("/v1", "/two-models/v1")
    assert main(["--config", str(path), "endpoints", "add", url, "--name", "two"]) == 0
    before = path.read_text()
    again = f"http://localhost:{server.port}/two-models/"
    assert main(["--config", str(path), "endpoints", "add", again]) == 2
    assert "is already the profile two" in capsys.readouterr().err
    assert path.read_text() == before
    # another server; a key variable named but not set is said, and the server still added
    monkeypatch.delenv("PHASECHAT_TEST_UNSET", raising=False)
    argv = ["--config", str(path), "endpoints", "add", server.base_url]
    assert main([*argv, "--key-env", "PHASECHAT_TEST_UNSET"]) == 0
    assert "$PHASECHAT_TEST_UNSET is not set: the server will get no key" in capsys.readouterr().err


async def test_a_profiles_port_is_asked_with_its_key_another_says_it_needs_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe_module, "USUAL_PORTS", {})  # not what runs on this machine
    monkeypatch.setenv("LOCKED_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the user's key: not sent to a port found
    with locked_server() as port:
        url = f"http://localhost:{port}/v1"
        with_key = await find_local([url], key_envs={url: "LOCKED_KEY"})
        without = await find_local([url])
    assert [(p.ok, p.models) for p in with_key] == [(True, ("locked-model",))]
    (refused,) = without
    assert refused.status == 401 and refused.needs_key and KEY not in refused.line()
    assert "no key was sent" in refused.line() and "OPENAI_API_KEY" not in refused.line()
