"""Ollama (backends/remote/servers/ollama.py) against a stand-in written from its source
(tests/standins/ollama.py, ollama/ollama@fb307609): recognised by `GET /api/version`
whatever its listing's `owned_by` (the model's namespace), talked to on its own
`/api/chat`, whose final message carries what `ollama run --verbose` prints: the model's
load apart from the prompt's evaluation, and the decode. A two-turn chat through the real
backend and session, and a chat that switches to another server and back."""

from __future__ import annotations

import httpx
import pytest

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.waterfall import LOAD, PREFILL, QUEUED, REST
from tests.standins import serve
from tests.standins.chat import chat
from tests.standins.ollama import Ollama
from tests.standins.sglang import SGLang


@pytest.mark.parametrize(
    ("model", "owner"), [("smollm2:135m", "library"), ("alice/smol:latest", "alice")]
)
async def test_a_two_turn_chat_shows_ollamas_own_phases(model: str, owner: str) -> None:
    with serve(Ollama, model=model, num_ctx=8192) as server:
        answers, backend = await chat(server.base_url)
        said = server.record()
        async with httpx.AsyncClient() as client:
            listing = (await client.get(f"{server.base_url}/models")).json()
    assert listing["data"][0]["owned_by"] == owner  # the namespace: not how it is told
    assert backend.family.name == "Ollama"
    assert backend.window is not None
    assert (backend.window.tokens, backend.window.source) == (8192, "Ollama /api/show num_ctx")
    assert said["paths"].count("/api/chat") == 2 and "/v1/chat/completions" not in said["paths"]
    assert said["paths"][:2] == ["/v1/models", "/api/version"]
    assert said["bodies"][0]["options"]["num_predict"] == 64
    for answer, sent in zip(answers, said["sent"], strict=True):
        final = sent["final"]
        m, wf = answer.metrics, answer.waterfall
        assert m.server_source == "Ollama /api/chat"
        assert m.prompt_tokens == final["prompt_eval_count"]
        assert m.output_tokens == final["eval_count"]
        assert m.cached_tokens is None  # Ollama says nothing of a cached prefix
        load = final.get("load_duration", 0) / 1e6
        assert m.server_load_ms == pytest.approx(load)
        assert m.server_prompt_ms == pytest.approx(final["prompt_eval_duration"] / 1e6)
        assert m.server_predicted_ms == pytest.approx(final["eval_duration"] / 1e6)
        assert wf is not None and wf.contradiction is None, wf
        assert wf.ms(LOAD) == pytest.approx(load)
        assert wf.ms(PREFILL) == pytest.approx(final["prompt_eval_duration"] / 1e6)
        assert wf.ms(QUEUED) is None
        rest = wf.ms(REST)
        assert rest is not None and rest >= 0
        assert not m.warnings
    first, second = (a.metrics.server_load_ms for a in answers)
    assert first is not None and second is not None
    assert first >= 250 > 50 > second  # loaded by the first request, then held


async def test_switching_between_ollama_and_another_server_mid_chat() -> None:
    """Each answer goes to the backend of its turn, by that backend's own wire: Ollama's
    /api/chat, SGLang's /v1/chat/completions; the conversation carries over."""
    with serve(Ollama) as ollama, serve(SGLang) as sglang:
        first = RemoteBackend(RemoteConfig(base_url=ollama.base_url))
        other = RemoteBackend(RemoteConfig(base_url=sglang.base_url))
        await first.start()
        await other.start()
        session = TurnController(first, Settings(max_tokens=32, temperature=0))
        for backend, text in ((first, "Hi"), (other, "Why?"), (first, "And then?")):
            session.switch_backend(backend)
            async for _ in session.send(text):
                pass
        await first.aclose()
        await other.aclose()
        on_ollama, on_sglang = ollama.record(), sglang.record()
    assert [e.metrics.server_source for e in session.exchanges if e.metrics] == [
        "Ollama /api/chat",
        "SGLang sglext + SGLang /metrics",
        "Ollama /api/chat",
    ]
    # the system prompt, then each turn's question and answer
    assert [len(b["messages"]) for b in on_ollama["bodies"]] == [2, 6]
    assert [len(b["messages"]) for b in on_sglang["bodies"]] == [4]
