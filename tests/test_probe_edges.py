"""What a probe says of a server, and where the search for local servers looks
(backends/probe.py; issue 49, item 3): each line's parts at their bounds (one model and
two, a window of 0), the statuses that mean a key, and loopback's edges (127.0.0.2, a
port already asked, a URL that names no port, one that is no URL)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from phasechat.backends.remote.probe import (
    Probe,
    base_url_of,
    local_urls,
    port_keys,
    probe,
    shown_model,
)

URL = "http://127.0.0.1:8080/v1"


@pytest.mark.parametrize(
    ("probe", "line"),
    [
        (
            Probe(URL, "llama-server", ("/m/SmolLM2.gguf",), 4096),
            "llama-server · SmolLM2 · window 4,096",
        ),
        (Probe(URL, "vLLM", ("a", "b"), None), "vLLM · 2 models · window not said"),
        (Probe(URL, "vLLM", ("a",), 0), "vLLM · a · window not said"),
        (Probe(URL, "vLLM", ("a",), 1), "vLLM · a · window 1"),
        (Probe(URL, "vLLM", ("a",), 4096, problem="HTTP 503: loading"), "HTTP 503: loading"),
    ],
)
def test_a_probe_s_line(probe: Probe, line: str) -> None:
    assert probe.line() == line
    assert probe.ok is (probe.problem is None)


@pytest.mark.parametrize(("status", "key"), [(401, True), (403, True), (400, False),
                                             (404, False), (None, False)])  # fmt: skip
def test_only_a_401_or_a_403_asks_for_a_key(status: int | None, key: bool) -> None:
    assert Probe(URL, problem="x", status=status).needs_key is key


@pytest.mark.parametrize(
    ("probe", "slug"),
    [
        (Probe(URL, "llama-server"), "llama-server"),
        (Probe(URL, "LM Studio"), "lm-studio"),
        (Probe(URL, "OpenAI-compatible"), "127.0.0.1-8080"),  # the generic: its host's
        (Probe("http://box.lan/v1", "OpenAI-compatible"), "box.lan"),
        (Probe("http://box.lan/v1"), "box.lan"),
    ],
)
def test_a_profile_of_a_server_is_named_for_its_family_or_else_its_host(
    probe: Probe, slug: str
) -> None:
    assert probe.slug == slug


def test_a_probe_s_port_is_the_one_written() -> None:
    assert Probe(URL).port == 8080 and Probe("http://box.lan/v1").port is None


@pytest.mark.parametrize(
    ("listed", "shown"),
    [("SmolLM2.gguf", "SmolLM2"), ("/srv/models/qwen", "qwen"), ("org/model", "org/model")],
)
def test_a_model_file_is_shown_by_its_name(listed: str, shown: str) -> None:
    assert shown_model(listed) == shown


@pytest.mark.parametrize(
    ("typed", "url"),
    [
        ("  box:8000  ", "http://box:8000/v1"),
        ("http://box:8000", "http://box:8000/v1"),
        ("https://box/", "https://box/v1"),
        ("http://boX", "http://boX/v1"),  # only a final "/" is taken off
    ],
)
def test_what_a_user_types_is_trimmed_and_given_a_scheme_and_a_path(typed: str, url: str) -> None:
    assert base_url_of(typed) == url


@pytest.mark.parametrize(
    ("typed", "said"), [("   ", "no URL given"), ("ftp://box", "not an http(s) URL: ftp://box")]
)
def test_a_typed_url_is_refused_in_one_line(typed: str, said: str) -> None:
    with pytest.raises(ValueError, match="URL") as refused:
        base_url_of(typed)
    assert str(refused.value) == said


def test_loopback_is_all_of_127_and_each_port_is_asked_once() -> None:
    urls = local_urls(
        [
            "http://127.0.0.1:x/v1",  # no URL: left out, and the rest still looked at
            "http://127.0.0.2:9000/v1",  # all of 127/8 is this machine
            "http://localhost:8080/v1",  # a usual port already: once
            "http://localhost/v1",  # no port written: the usual ones are asked anyway
            "http://10.0.0.5:9002/v1",  # another machine: never
            "http://127.0.0.1:9000/v1",  # 9000 again
            "http://localhost:9001/v1",
        ]
    )
    assert urls[5:] == ["http://127.0.0.1:9000/v1", "http://127.0.0.1:9001/v1"]
    assert len(urls) == 7


def test_each_loopback_port_is_asked_with_the_first_profile_s_key() -> None:
    keys = port_keys(
        {
            "http://127.0.0.1:9000/v1": "FIRST_KEY",
            "http://localhost:9000/other/v1": "SECOND_KEY",
            "http://127.0.0.9:9001/v1": "LOOPBACK_KEY",
            "http://localhost:9003/v1": "LOCALHOST_KEY",
            "http://10.0.0.5:9002/v1": "LAN_KEY",  # not this machine
            "http://localhost/v1": "NO_PORT_KEY",
            "http://127.0.0.1:x/v1": "BAD_KEY",
        }
    )
    assert keys == {9000: "FIRST_KEY", 9001: "LOOPBACK_KEY", 9003: "LOCALHOST_KEY"}


# -- a probe's answers, word for word ------------------------------------------------


@contextlib.contextmanager
def answering(status: int | None) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A server on 127.0.0.1 whose every GET answers `status` (None: it takes the
    connection and never answers): its base URL, and each request's headers."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            if status is None:
                time.sleep(3)
                return
            body = b"<html>a web page</html>" if status == 200 else b"{}"
            self.send_response(status)
            self.send_header("content-type", "text/html" if status == 200 else "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    seen: list[dict[str, str]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


async def test_a_403_to_a_probe_without_a_key_says_to_add_one() -> None:
    with answering(403) as (url, _):
        said = await probe(url, None, timeout_s=2)
    assert said.status == 403 and said.base_url == url
    assert said.problem == (
        f"HTTP 403 from {url}: no key was sent (add it by its URL with the name of the "
        "variable that holds its key)"
    )


async def test_a_404_to_a_probe_without_a_key_is_not_said_to_want_one() -> None:
    with answering(404) as (url, _):
        said = await probe(url, None, timeout_s=2)
    assert said.status == 404 and said.problem is not None
    assert "no key was sent" not in said.problem


async def test_a_web_page_is_said_not_to_be_an_api_with_its_status() -> None:
    with answering(200) as (url, _):
        said = await probe(url, None, timeout_s=2)
    assert (said.base_url, said.status) == (url, 200)
    assert said.problem == (
        f"{url}/models answered with no model list: not an OpenAI-compatible server "
        "(a web page? check the URL)"
    )


async def test_a_probe_sends_the_key_of_openai_api_key_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-probe-0123456789")
    with answering(401) as (url, seen):
        await probe(url, timeout_s=2)
    assert seen[0]["authorization"] == "Bearer sk-probe-0123456789"


async def test_a_server_that_never_answers_is_said_within_the_probe_s_time() -> None:
    with answering(None) as (url, _):
        said = await probe(url, None, timeout_s=0.3)
    assert (said.base_url, said.status, said.ok) == (url, None, False)
    assert said.problem is not None and "0.3 s" in said.problem, said.problem
