"""The remote backend against real llama-server streams, recorded byte for byte."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    PrefillProgress,
    ResponseStarted,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record

REQUEST = GenerationRequest((Message("user", "hi"),), max_tokens=100)


def replay(
    body: bytes, status: int = 200, ctype: str = "text/event-stream", chunk: int = 0
) -> httpx.MockTransport:
    """A transport that answers every request with `body`, in reads of `chunk` bytes."""

    async def stream_body() -> AsyncIterator[bytes]:
        step = chunk or len(body) or 1
        for i in range(0, len(body), step):
            yield body[i : i + step]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "llamacpp"}]})
        return httpx.Response(status, headers={"content-type": ctype}, content=stream_body())

    return httpx.MockTransport(handler)


async def collect(backend: RemoteBackend) -> list[Event]:
    return [e async for e in backend.stream(REQUEST)]


def backend_for(body: bytes, **kw: object) -> RemoteBackend:
    return RemoteBackend(RemoteConfig(base_url="http://test/v1"), replay(body, **kw))  # type: ignore[arg-type]


def expected_text(path: Path) -> str:
    text = []
    for line in path.read_text().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


@pytest.mark.parametrize("chunk", [0, 1, 13])
async def test_usage_and_timings_from_last_chunk(fixtures_dir: Path, chunk: int) -> None:
    path = fixtures_dir / "01-usage.sse"
    events = await collect(backend_for(path.read_bytes(), chunk=chunk))
    assert isinstance(events[0], ResponseStarted)
    assert events[-1] == Finished("length")
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == expected_text(path) and text.startswith("Lighthouses are")
    assert [e for e in events if isinstance(e, Usage)] == [Usage(28, 40, 0)]
    (timings,) = [e for e in events if isinstance(e, ServerTimings)]
    assert (timings.prompt_n, timings.predicted_n, timings.cache_n) == (28, 40, 0)
    assert timings.prompt_ms == pytest.approx(61.163)


async def test_cached_prefix_reported(fixtures_dir: Path) -> None:
    events = await collect(backend_for((fixtures_dir / "02-cached-prefix.sse").read_bytes()))
    (timings,) = [e for e in events if isinstance(e, ServerTimings)]
    assert (timings.cache_n, timings.prompt_n) == (67, 19)
    trace = Trace("remote", "m")
    # The metrics take cached and evaluated prompt tokens from the server's own report.
    for e in events:
        trace.observe(e, 1)
    m = compute(trace)
    assert (m.cached_tokens, m.evaluated_prompt_tokens, m.prompt_tokens_source) == (
        67,
        19,
        "server",
    )


async def test_prefill_progress_and_per_token_timings(fixtures_dir: Path) -> None:
    events = await collect(backend_for((fixtures_dir / "03-progress-per-token.sse").read_bytes()))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert progress[0] == PrefillProgress(26, 14, 14, 0)
    assert progress[-1].processed == progress[-1].total == 26
    assert len([e for e in events if isinstance(e, ServerTimings)]) > 5
    assert isinstance(events[-1], Finished)


async def test_japanese_text_is_whole(fixtures_dir: Path) -> None:
    path = fixtures_dir / "04-japanese.sse"
    events = await collect(backend_for(path.read_bytes(), chunk=5))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == expected_text(path)
    assert "\ufffd" not in text and any(ord(c) > 0x3000 for c in text)


async def test_no_usage_stream_still_has_timings(fixtures_dir: Path) -> None:
    events = await collect(backend_for((fixtures_dir / "05-no-usage.sse").read_bytes()))
    assert not [e for e in events if isinstance(e, Usage)]
    assert [e for e in events if isinstance(e, ServerTimings)]
    assert isinstance(events[-1], Finished)


@pytest.mark.parametrize("name", ["01-usage.sse", "05-no-usage.sse", "06-stop-sequence.sse"])
async def test_finish_reason_is_the_servers(fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / name
    reasons = [
        c["finish_reason"]
        for line in path.read_text().splitlines()
        if line.startswith("data: {")
        for c in json.loads(line[6:]).get("choices", [])
        if c.get("finish_reason")
    ]
    events = await collect(backend_for(path.read_bytes()))
    last = events[-1]
    assert isinstance(last, Finished) and last.reason == reasons[-1]


async def test_bad_request_body_becomes_one_line(fixtures_dir: Path) -> None:
    body = (fixtures_dir / "07-bad-request.json").read_bytes()
    events = await collect(backend_for(body, status=400, ctype="application/json"))
    (error,) = events
    assert isinstance(error, StreamError) and error.kind == "bad_request"
    assert "n_probs" in error.message and "\n" not in error.message


async def test_recorder_counts_tokens_from_usage(fixtures_dir: Path) -> None:
    backend = backend_for((fixtures_dir / "01-usage.sse").read_bytes())
    trace = Trace("remote", "m")
    async for _ in record(backend.stream(REQUEST), trace):
        pass
    m = compute(trace)
    assert m.output_tokens == 40 and not m.output_tokens_estimated
    assert m.server_prompt_n == 28 and m.ttft_ms is not None and m.e2e_ms is not None
    assert m.ttft_ms <= m.e2e_ms


async def test_models_listing_picks_first_and_detects_llama_server() -> None:
    backend = backend_for(b"")
    await backend.start()
    assert (
        backend.state == "ready" and backend.model == "m" and backend.family.name == "llama-server"
    )
    assert backend.request_body(REQUEST)["return_progress"] is True
    assert backend.request_body(REQUEST)["stream_options"] == {"include_usage": True}
