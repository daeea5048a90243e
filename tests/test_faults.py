"""The remote backend against a scripted server that misbehaves on demand.

Each test drives a `TurnController` over `RemoteBackend`, as the TUI and `phasechat ask` do,
and checks what the user would see (status, one-line error, notices) and that the text
that did arrive is kept. Stall and first-token deadlines are shortened to fractions of a
second; the behaviours are in tests/fault_server.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import phasechat.backends.remote.backend
from phasechat.backends.events import GenerationRequest, Message, ResponseStarted, TextDelta
from phasechat.backends.remote.backend import TLS_OFF, RemoteBackend, RemoteConfig
from phasechat.backends.remote.httplog import redact_headers, redact_secret, redact_url
from phasechat.backends.remote.sse import SSEEvent, SSEParser
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import Exchange, TurnController
from tests.fault_server import FaultServer
from tests.llama_server import free_port

SECRET = "sk-phasechat-test-9f8e7d6c5b4a39281706"


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as s:
        yield s


async def ask(
    base_url: str, model: str, max_tokens: int = 64, **config: Any
) -> tuple[Exchange, RemoteBackend]:
    """One prompt through a fresh session; the finished exchange and its backend."""
    config.setdefault("stall_timeout_s", 0.3)
    backend = RemoteBackend(RemoteConfig(base_url=base_url, model=model, **config))
    turns = TurnController(backend, Settings(max_tokens=max_tokens))
    try:
        async for _ in turns.send("hello"):
            pass
    finally:
        await backend.aclose()
    exchange = turns.exchanges[-1]
    assert exchange.metrics is not None and exchange.answer.metrics is not None
    return exchange, backend


def failed(exchange: Exchange, kind: str) -> str:
    """The error message of a failed exchange, after checking how it ended."""
    assert exchange.answer.status == "error"
    assert exchange.trace.error is not None and exchange.trace.error.kind == kind
    assert exchange.metrics is not None and exchange.metrics.finish == "error"
    assert exchange.answer.error == exchange.trace.error.message
    return exchange.answer.error


# -- before the answer: connection and HTTP status -----------------------------------


async def test_connection_refused() -> None:
    ex, _ = await ask(f"http://127.0.0.1:{free_port()}/v1", "ok")
    assert "connection refused" in failed(ex, "connection")
    assert ex.trace.error is not None and ex.trace.error.retryable
    assert ex.answer.content == ""


async def test_unknown_host() -> None:
    ex, _ = await ask("http://phasechat-nowhere.invalid/v1", "ok")
    assert "phasechat-nowhere.invalid" in failed(ex, "connection")
    assert "unknown host" in ex.answer.error  # type: ignore[operator]


@pytest.mark.parametrize(
    ("status", "kind", "says", "retryable"),
    [
        (401, "auth", "check the API key in $OPENAI_API_KEY", False),
        (403, "auth", "the key lacks access", False),
        (404, "not_found", "wrong base URL", False),
        (500, "server", "HTTP 500 server error", True),
        (503, "server", "(retry in 7 s)", True),
    ],
)
async def test_http_status_is_one_clear_line(
    server: FaultServer, status: int, kind: str, says: str, retryable: bool
) -> None:
    ex, _ = await ask(server.base_url, f"status-{status}")
    message = failed(ex, kind)
    assert says in message and f"scripted {status}" in message  # the server's own words
    assert "\n" not in message
    assert ex.trace.error is not None
    assert ex.trace.error.status == status and ex.trace.error.retryable is retryable


@pytest.mark.parametrize(("form", "wait"), [("", 7.0), ("-date", 60.0)])
async def test_429_says_when_to_retry(server: FaultServer, form: str, wait: float) -> None:
    ex, _ = await ask(server.base_url, f"status-429{form}")
    message = failed(ex, "rate_limited")
    error = ex.trace.error
    assert error is not None and error.retryable and error.retry_after_s is not None
    assert message.endswith(f"(retry in {error.retry_after_s:g} s)")
    # An HTTP date becomes whole seconds from now (the clock may have moved on by one).
    assert wait - 2 <= error.retry_after_s <= wait


async def test_headers_that_never_come_time_out(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "nohead-30", first_token_timeout_s=0.3)
    assert "no answer from" in failed(ex, "timeout") and "within 0.3 s" in ex.answer.error  # type: ignore[operator]
    assert ex.trace.error is not None and ex.trace.error.retryable


# -- replies that are not the stream we asked for ---------------------------------------


async def test_json_reply_is_kept_and_says_it_did_not_stream(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "json")
    assert ex.answer.status == "complete" and ex.answer.content == "whole answer"
    assert any("did not stream" in n for n in ex.trace.notices)
    assert ex.metrics is not None and ex.metrics.output_tokens == 2  # the server's usage


@pytest.mark.parametrize(("model", "kind"), [("html", "protocol"), ("html-502", "server")])
async def test_html_page_shows_its_title_not_its_markup(
    server: FaultServer, model: str, kind: str
) -> None:
    message = failed((await ask(server.base_url, model))[0], kind)
    assert "Proxy login" in message and "<" not in message


# -- broken streams: the partial answer is kept --------------------------------------


async def test_malformed_event_keeps_the_text_before_it(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "malformed")
    assert "malformed event" in failed(ex, "protocol")
    assert ex.answer.content == "ok "


@pytest.mark.parametrize("step", [1, 2, 5])
async def test_events_split_at_any_byte(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    reads: list[bytes] = []

    class Recording(SSEParser):
        def feed(self, chunk: bytes) -> list[SSEEvent]:
            reads.append(chunk)
            return super().feed(chunk)

    monkeypatch.setattr(phasechat.backends.remote.backend, "SSEParser", Recording)
    ex, _ = await ask(server.base_url, f"split-{step}")
    assert ex.answer.status == "complete" and ex.answer.content == "αβγ δ😀"
    # The reads really did cut through characters: some read ends inside one.
    partial = [r for r in reads if r.decode("utf-8", errors="ignore").encode() != r]
    assert len(reads) > 20 and partial


async def test_keepalive_comments_are_not_text(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "keepalive")
    assert ex.answer.status == "complete" and ex.answer.content == "ab"
    assert ex.trace.deltas == 2


async def test_stream_without_done_but_with_finish_is_normal(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "nodone")
    assert ex.answer.status == "complete" and ex.answer.content == "complete"
    assert ex.trace.finish == "stop"


async def test_stream_cut_with_no_finish_is_an_error(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "cut")
    assert "stream ended early after 3 chunks" in failed(ex, "connection")
    assert ex.answer.content == "tok tok tok "
    assert ex.metrics is not None and ex.metrics.chars == 12 and ex.metrics.ttft_ms is not None


async def test_error_object_mid_stream(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "errormid")
    assert failed(ex, "server") == "server error: model crashed"
    assert ex.answer.content == "partial"
    assert ex.trace.error is not None and ex.trace.error.retryable


@pytest.mark.parametrize("model", ["stall-30", "pingstall-30"])
async def test_stall_mid_stream(server: FaultServer, model: str) -> None:
    # pingstall keeps sending ": ping" comments: alive, but no answer is coming.
    ex, _ = await ask(server.base_url, model)
    message = failed(ex, "stalled")
    assert message.startswith("stalled after 3 chunks") and "nothing new for 0.3 s" in message
    assert ex.trace.error is not None and ex.trace.error.retryable
    assert ex.answer.content == "tok tok tok "


async def test_slow_prefill_is_not_a_stall(server: FaultServer) -> None:
    # One silent second before the first token, with a 0.3 s stall limit.
    ex, _ = await ask(server.base_url, "slowstart-1")
    assert ex.answer.status == "complete" and ex.answer.content == "tok tok tok "
    assert ex.metrics is not None and ex.metrics.ttft_ms is not None
    assert ex.metrics.ttft_ms > 300  # the wait was longer than a stall, yet allowed


async def test_the_requests_own_phases_come_before_the_first_token(server: FaultServer) -> None:
    # The headers come 0.3 s after the request (with a 0.3 s stall limit: not a stall).
    ex, _ = await ask(server.base_url, "lateheads-0.3")
    m = ex.metrics
    assert m is not None and ex.answer.content == "tok tok tok "
    assert m.headers_ms is not None and m.headers_ms >= 300
    assert m.connect_ms is not None and 0 < m.connect_ms < m.headers_ms  # a new connection
    assert m.ttft_ms is not None and m.headers_ms <= m.ttft_ms
    assert m.time_to_second_token_ms is not None and m.time_to_second_token_ms >= m.ttft_ms
    assert m.first_byte_ms == m.headers_ms


async def test_a_slow_event_that_keeps_coming_is_not_a_stall(server: FaultServer) -> None:
    # One event trickles in over a second, with a 0.3 s stall limit: bytes, not events,
    # show that the server is still talking (comments do not: see pingstall above).
    ex, _ = await ask(server.base_url, "trickle-1")
    assert ex.answer.status == "complete", ex.answer.error
    assert ex.answer.content == "tok slow but steady"


async def test_no_first_token_in_time_is_a_timeout(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "slowstart-30", first_token_timeout_s=0.3)
    assert failed(ex, "timeout") == "no token within 0.3 s"


async def test_connection_reset_mid_stream(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "reset")
    assert "connection reset by the server after 3 chunks" in failed(ex, "connection")
    assert ex.answer.content == "tok tok tok "


async def test_endless_stream_stops_at_max_tokens(server: FaultServer) -> None:
    ex, _ = await ask(server.base_url, "endless", max_tokens=25)
    assert ex.answer.status == "complete" and ex.trace.finish == "length"
    assert ex.answer.content == "more " * 25
    assert any("ignored max_tokens (25)" in n for n in ex.trace.notices)
    await wait_for_idle(server)  # the server's side of the stream was closed too


async def test_10mb_event_arrives_whole(server: FaultServer) -> None:
    # Straight from the backend: the session would spend seconds on the tiktoken
    # estimate of 10 MB, which is telemetry's cost, not the transport's.
    backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="huge-10"))
    request = GenerationRequest((Message("user", "hi"),))
    events = [e async for e in backend.stream(request)]
    await backend.aclose()
    (delta,) = [e for e in events if isinstance(e, TextDelta)]
    assert delta.text == "x" * (10 * 1024 * 1024)
    assert type(events[-1]).__name__ == "Finished"


# -- cancellation ----------------------------------------------------------------------


async def wait_for_idle(server: FaultServer) -> None:
    """Until the server has no open connection (bounded: a leak fails, not hangs)."""
    for _ in range(500):
        if server.open_connections == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{server.open_connections} connections still open")


async def test_cancel_storm_leaves_nothing_open(server: FaultServer) -> None:
    backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="endless"))
    turns = TurnController(backend, Settings(max_tokens=100_000))
    for i in range(50):
        exchange = turns.begin(f"question {i}")
        first = asyncio.Event()
        how = i % 3

        async def consume(
            exchange: Exchange = exchange, first: asyncio.Event = first, how: int = how
        ) -> None:
            events = turns.run(exchange)
            async for event in events:
                if isinstance(event, ResponseStarted if how == 1 else TextDelta):
                    first.set()
                    if how == 1:
                        await events.aclose()  # the consumer walks away
                        return

        task = asyncio.create_task(consume())
        if how == 0:
            await asyncio.sleep(0)  # cancelled while connecting
        else:
            await first.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert exchange.answer.status == "cancelled"
        if how == 2:
            assert exchange.answer.content.startswith("more ")  # the partial text stays
    await wait_for_idle(server)
    await backend.aclose()
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert len(turns.exchanges) == 50 and turns.current is None


# -- secrets and TLS -------------------------------------------------------------------


async def test_api_key_never_in_logs_or_results(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PHASECHAT_FAULT_KEY", SECRET)
    caplog.set_level(logging.DEBUG)  # every logger, httpx and httpcore included
    shown: list[str] = []
    for model in ("ok-3", "echokey", "echokey-stream", "status-500", "stall-30"):
        ex, backend = await ask(server.base_url, model, api_key_env="PHASECHAT_FAULT_KEY")
        shown += [ex.answer.content, ex.answer.error or "", *ex.trace.notices]
        metrics = ex.answer.metrics.as_dict() if ex.answer.metrics else None
        shown += [backend.state_detail, json.dumps(metrics)]
    assert server.headers[-1]["authorization"] == f"Bearer {SECRET}"  # it was sent
    records = [r for r in caplog.records if r.name == "phasechat.http"]
    assert len(records) == 2 * 5  # each request and each response
    assert "'authorization': 'Bearer sk-…redacted'" in records[0].getMessage()
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in logs and SECRET[3:12] not in logs
    echoed = [s for s in shown if "invalid credentials Bearer sk-…redacted" in s]
    assert len(echoed) == 2  # the 401 and the mid-stream echo, both redacted
    assert not [s for s in shown if SECRET in s or SECRET[3:12] in s]


async def test_credentials_in_headers_and_urls_are_redacted() -> None:
    assert redact_secret(f"Bearer {SECRET}") == "Bearer sk-…redacted"
    assert redact_secret("short") == "…redacted"  # too short to show even a prefix
    assert redact_headers({"X-Api-Key": "k1", "Accept": "*/*"}) == {
        "X-Api-Key": "…redacted",
        "Accept": "*/*",
    }
    url = "https://me:hunter2@h.example/v1?key=abc&x=a b"
    assert redact_url(url) == "https://me:…redacted@h.example/v1?key=…redacted&x=a+b"
    backend = RemoteBackend(RemoteConfig(base_url=f"http://me:hunter2@127.0.0.1:{free_port()}"))
    await backend.start()
    await backend.aclose()
    assert backend.state == "failed" and "connection refused" in backend.state_detail
    assert (
        "me:…redacted@127.0.0.1" in backend.state_detail and "hunter2" not in backend.state_detail
    )


def self_signed(tmp: Path) -> ssl.SSLContext:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a self-signed certificate")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_tls_is_verified_unless_turned_off_explicitly(tmp_path: Path) -> None:
    assert RemoteConfig().verify_tls is True
    async with FaultServer(tls=self_signed(tmp_path)) as tls:
        ex, backend = await ask(tls.base_url, "ok-2")
        message = failed(ex, "connection")
        assert "TLS error" in message and "certificate" in message
        assert ex.trace.notices == [] and "TLS" not in backend.state_detail

        backend = RemoteBackend(RemoteConfig(base_url=tls.base_url, verify_tls=False))
        assert "TLS verification off" in backend.state_detail
        await backend.start()
        assert backend.state == "ready" and "TLS verification off" in backend.state_detail
        turns = TurnController(backend, Settings(max_tokens=8))
        for prompt in ("one", "two"):
            async for _ in turns.send(prompt):
                pass
        await backend.aclose()
    for ex in turns.exchanges:  # once per answer, not once per chunk or per session
        assert ex.answer.status == "complete" and ex.trace.notices == [TLS_OFF]
