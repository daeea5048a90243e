"""The remote backend against a real OpenAI-compatible server on 127.0.0.1.

`python -m llama_cpp.server` serves the bundled model. It streams SSE but ignores
`stream_options` and sends neither usage nor timings, so counts are estimates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncGenerator

import pytest

from phasechat.backends.events import (
    Finished,
    GenerationRequest,
    Message,
    ResponseStarted,
    StreamError,
    TextDelta,
)
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController

pytestmark = [pytest.mark.server, pytest.mark.model]


async def test_models_and_streamed_answer(llama_server: str) -> None:
    backend = RemoteBackend(RemoteConfig(base_url=llama_server))
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    assert backend.models and backend.model == backend.models[0]
    req = GenerationRequest((Message("user", "Say hello."),), max_tokens=12, temperature=0)
    events = [e async for e in backend.stream(req)]
    await backend.aclose()
    assert isinstance(events[0], ResponseStarted)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1 and "".join(d.text for d in deltas).strip()
    assert isinstance(events[-1], Finished)


async def test_session_marks_counts_as_estimates(llama_server: str) -> None:
    backend = RemoteBackend(RemoteConfig(base_url=llama_server))
    await backend.start()
    turns = TurnController(backend, Settings(max_tokens=10, temperature=0))
    async for _ in turns.send("Name a fruit."):
        pass
    await backend.aclose()
    m = turns.exchanges[-1].metrics
    assert m is not None
    assert m.output_tokens_estimated and m.prompt_tokens_source == "estimate"
    assert m.ttft_ms is not None and m.e2e_ms is not None and 0 < m.ttft_ms <= m.e2e_ms


async def test_cancel_closes_the_response(llama_server: str) -> None:
    backend = RemoteBackend(RemoteConfig(base_url=llama_server))
    await backend.start()
    req = GenerationRequest((Message("user", "Write a long poem."),), max_tokens=300)
    stream = backend.stream(req)
    assert isinstance(stream, AsyncGenerator)  # closed below, before it ends
    n = 0
    async for event in stream:
        if isinstance(event, TextDelta):
            n += 1
            if n == 3:
                break
    await stream.aclose()
    # the server is free: a new request is answered right away
    events = [
        e async for e in backend.stream(GenerationRequest((Message("user", "Hi"),), max_tokens=3))
    ]
    await backend.aclose()
    assert isinstance(events[-1], Finished)


async def test_unknown_model_is_a_clear_error(llama_server: str) -> None:
    backend = RemoteBackend(RemoteConfig(base_url=llama_server + "/nope"))
    events = [e async for e in backend.stream(GenerationRequest((Message("user", "Hi"),)))]
    await backend.aclose()
    (error,) = events
    assert isinstance(error, StreamError) and error.kind == "not_found" and error.status == 404


def test_ask_json_against_the_server(llama_server: str) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "phasechat",
            "ask",
            "--backend",
            "openai",
            "--base-url",
            llama_server,
            "--json",
            "--max-tokens",
            "8",
            "Hello",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENAI_API_KEY": "sk-test-secret"},
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend"] == "openai" and out["text"]
    assert out["output_tokens_estimated"] is True
    assert "sk-test-secret" not in r.stdout + r.stderr
