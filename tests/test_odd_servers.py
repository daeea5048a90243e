"""Servers and proxies that are odd without being broken (issue 47, items 9, 10, 12),
on the scripted fault server (tests/fault_server.py): tokens handed on in one burst, a
`/metrics` count smaller than the answer, a base URL with a query string.

Each drives a `TurnController` over `RemoteBackend`, as the TUI and `ask` do, and checks
what the user would see: the figures, the reason for an unknown one, the requests sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from phasechat.backends.events import Message
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.servers.forcing import Server
from phasechat.backends.remote.urls import endpoint, root_of
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import Exchange, TurnController
from phasechat.telemetry.live import snapshot
from phasechat.telemetry.verdict import engine_says, stats_line
from phasechat.tui.widgets.telemetry_view import answer_footer
from tests.fault_server import FaultServer

QUERY = "api-version=2024-10-21"


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as s:
        yield s


async def answered(server: FaultServer, model: str, under: str = "", query: str = "") -> Exchange:
    """One prompt to `server` (its base URL under `/<under>/`, with `?<query>`) as the
    app sends it: the backend started (its listing, its family's /metrics), then the
    turn, then the prompt's rendering (vLLM's /tokenize); the finished exchange."""
    base = server.base_url.replace("/v1", f"/{under}/v1") if under else server.base_url
    backend = RemoteBackend(
        RemoteConfig(base_url=f"{base}?{query}" if query else base, model=model)
    )
    turns = TurnController(backend, Settings(max_tokens=400))
    try:
        await backend.start()
        async for _ in turns.send("hello"):
            pass
        await backend.render((Message("user", "hello"),))
    finally:
        await backend.aclose()
    exchange = turns.exchanges[-1]
    assert exchange.answer.status == "complete", exchange.answer.error
    assert exchange.metrics is not None
    return exchange


# -- 9: a burst is no decode rate ----------------------------------------------------


@pytest.mark.parametrize("n", [300, 7])
async def test_tokens_handed_on_in_one_burst_have_no_decode_rate(
    server: FaultServer, n: int
) -> None:
    ex = await answered(server, f"burst-{n}")
    m = ex.metrics
    assert m is not None and m.output_tokens == n
    assert m.decode_tok_s is None and m.tpot_ms is None and m.chars_per_s is None
    assert m.decode_unknown is not None and "burst" in m.decode_unknown
    assert m.decode_unknown in m.warnings  # the footer's warning line, --json's warnings
    assert m.as_dict()["decode_unknown"] == m.decode_unknown
    assert m.ttft_ms is not None and m.ttft_ms >= 50  # the wait itself is still measured
    assert f"decode unknown ({m.decode_unknown})" in stats_line(m)  # ask --stats
    assert "burst: no tok/s" in answer_footer(m).plain
    live = snapshot(ex.trace, ex.trace.t_done or 0)  # the live panel, the same rule
    assert live.decode_tok_s is None and live.decode_unknown is not None


async def test_a_fast_server_that_streams_each_token_keeps_its_rate(server: FaultServer) -> None:
    """500 tokens a second, each in its own write: faster than most engines, and a rate."""
    ex = await answered(server, "paced-200-500")
    m = ex.metrics
    assert m is not None and m.decode_unknown is None
    # its pace, give or take a busy machine's lag: far below the burst floor either way
    assert m.decode_tok_s is not None and 100 < m.decode_tok_s < 1_000
    live = snapshot(ex.trace, ex.trace.t_done or 0)
    assert live.decode_unknown is None and live.decode_tok_s is not None


# -- 10: a smaller count than the answer's is a mismatch, not a crowd -------------------


async def test_a_metrics_count_below_the_answers_is_named_a_mismatch(server: FaultServer) -> None:
    ex = await answered(server, "ok-300", under="counts-9")
    m = ex.metrics
    assert m is not None and m.output_tokens == 300
    assert m.server_unknown == (
        "mismatch: the server's /metrics counted 9 generated tokens, its usage 300 for this answer"
    )
    assert "other requests" not in engine_says(m)
    assert m.server_decode_tok_s is None  # no account from a count that does not add up


async def test_a_metrics_count_above_the_answers_is_other_requests(server: FaultServer) -> None:
    ex = await answered(server, "ok-300", under="counts-320")
    m = ex.metrics
    assert m is not None and m.server_unknown is not None
    assert m.server_unknown.endswith("other requests ran at the same time")
    assert "320" in m.server_unknown


# -- 12: a base URL's query string on every request -----------------------------------


async def test_a_base_urls_query_is_kept_on_every_request(server: FaultServer) -> None:
    await answered(server, "ok-5", under="counts-5", query=QUERY)
    paths = {p.partition("?")[0] for p in server.paths}
    assert {
        "/counts-5/v1/models",
        "/counts-5/v1/chat/completions",
        "/counts-5/metrics",
        "/counts-5/tokenize",
    } <= paths
    assert all(p.endswith(f"?{QUERY}") and p.count("?") == 1 for p in server.paths)


@pytest.mark.parametrize(
    ("base", "path", "url"),
    [
        ("http://h:8/v1", "/models", "http://h:8/v1/models"),
        ("http://h:8/v1/", "/chat/completions", "http://h:8/v1/chat/completions"),
        (
            f"https://x.openai.azure.com/openai/v1?{QUERY}",
            "/chat/completions",
            f"https://x.openai.azure.com/openai/v1/chat/completions?{QUERY}",
        ),
        ("http://[::1]:8080/v1/?a=1&b=2#frag", "/models", "http://[::1]:8080/v1/models?a=1&b=2"),
        ("http://h?x=1", "/models", "http://h/models?x=1"),
    ],
)
def test_a_path_is_joined_before_the_query(base: str, path: str, url: str) -> None:
    assert endpoint(base, path) == url


def test_a_servers_own_endpoints_keep_the_query_too() -> None:
    base = f"https://x.example/openai/v1/?{QUERY}"
    assert root_of(base) == f"https://x.example/openai?{QUERY}"
    assert endpoint(root_of(base), "/metrics") == f"https://x.example/openai/metrics?{QUERY}"
    teacher = Server(client=None, base_url=base, headers={}, model="m")  # type: ignore[arg-type]
    assert endpoint(teacher.v1, "/completions") == (
        f"https://x.example/openai/v1/completions?{QUERY}"
    )
