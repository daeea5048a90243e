"""Issue 39, the divergence where a side is a server (chat/trips/forced_sides.py): the
model here against a real llama-server and a real vLLM of the same model, each way
round, over every turn of a saved chat (`compare --chat`) and in the compare view; a
server of another vocabulary, or one that gives no log-probabilities, says why."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from textual.widgets import Static

from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.servers.forcing import TOP_K, Server
from phasechat.backends.remote.servers.llama_server.teacher import LLAMA_SERVER_FORCING
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import Comparison, Side
from phasechat.chat.trips.diverge import Turn, diverge, overall
from phasechat.chat.trips.forced_sides import (
    PROBE,
    Reader,
    Teaching,
    reader_of,
    vocabulary_check,
    why_unread,
)
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import CompareScreen
from phasechat.tui.screens.divergence_view import DivergenceView
from tests.helpers import wait_for
from tests.test_compare_cli import compare_chat, saved_chat
from tests.vllm_server import MODEL, VllmServer

SETTINGS = Settings(max_tokens=12, temperature=0)
TURNS = (
    (Message("system", "Be brief."), Message("user", "What is a lighthouse?")),
    (
        Message("system", "Be brief."),
        Message("user", "What is a lighthouse?"),
        Message("assistant", "A tower with a bright light that guides ships at night."),
        Message("user", "Who kept them?"),
    ),
)


def fake_llama_server(port: int, detokenized: str, probe_ids: list[int]) -> Server:
    """A llama-server that spells every id sequence as `detokenized` and splits any text
    into `probe_ids` (one byte a piece of the text)."""

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/detokenize":
            return httpx.Response(200, json={"content": detokenized})
        text = body["content"].encode()
        pieces = [{"id": i, "piece": [b]} for i, b in zip(probe_ids, text, strict=False)]
        return httpx.Response(200, json={"tokens": pieces})

    client = httpx.AsyncClient(transport=httpx.MockTransport(reply))
    return Server(client, f"http://127.0.0.1:{port}/v1", {}, "m")


def test_another_vocabulary_on_a_server_is_found_by_its_text_and_by_a_probe() -> None:
    answer = Teaching((1, 2), (5, 6), (b"Hi", b" there"))
    probe = list(range(len(PROBE.encode())))

    async def check(spelled: str, ids_b: list[int]) -> str | None:
        a = Reader("A", forcing=LLAMA_SERVER_FORCING, server=fake_llama_server(1, "x", probe))
        b = Reader("B", forcing=LLAMA_SERVER_FORCING, server=fake_llama_server(2, spelled, ids_b))
        return await vocabulary_check(a, b, answer)

    assert asyncio.run(check("Hi there", probe)) is None
    other_text = asyncio.run(check("Hi tere", probe))
    assert other_text is not None and "reads A's answer ids as other text" in other_text
    other_ids = asyncio.run(check("Hi there", [p + 1 for p in probe]))
    assert other_ids is not None and "split the same text into other ids" in other_ids


def test_a_server_without_log_probabilities_says_so() -> None:
    backend = RemoteBackend(RemoteConfig(base_url="http://127.0.0.1:1/v1", name="ollama"))
    assert reader_of(backend) is None  # an OpenAI-compatible family: none of its own
    assert "gives no log-probabilities of tokens it did not sample" in why_unread(backend)


@pytest.mark.model
@pytest.mark.server
def test_a_saved_chat_against_llama_server_each_way_round(real_llama_server: str) -> None:
    """The same GGUF here and on llama-server: over each side's top 20, the same top
    choice at every position and KL near 0, whichever side is A; llama-server's answers
    are its text split by its own tokenizer."""
    chat = saved_chat()
    for sides, retokenized in ((("local", "openai"), False), (("openai", "local"), True)):
        a, b = sides
        out = compare_chat(chat, b, a, "--base-url", real_llama_server)
        turns = out["turns"]
        assert len(turns) == 3
        for t in turns:
            d = t["divergence"]
            assert d is not None, t["why"]
            assert t["retokenized"] is retokenized and d["top_k"] == TOP_K
            assert d["positions"] == len(d["kl"]) >= 1
            # the other order of sums (one token a request there, one prefill here), or
            # flash attention on one side only: measured KL max 0.016 nats
            assert d["top1_agreement"] >= 0.9 and d["kl_max"] < 0.1
        assert out["divergence"]["top_k"] == TOP_K
        (caveat,) = out["caveats"]  # what llama-server's figures cannot be
        assert "a request of its own, as a batch of one" in caveat


def sides_of(*backends: Any) -> tuple[Side, Side]:
    a, b = backends
    return Side("A", a, SETTINGS), Side("B", b, SETTINGS)


async def on_vllm(vllm: VllmServer, local: LocalBackend | None) -> list[Turn]:
    """Both turns with A the model here (or vLLM, when `local` is None) and B vLLM."""
    remote = [RemoteBackend(RemoteConfig(base_url=vllm.base_url, model=MODEL)) for _ in "AB"]
    try:
        for backend in remote:
            await backend.start()
            assert backend.state == "ready", backend.state_detail
        a = local if local is not None else remote[0]
        return await diverge(*sides_of(a, remote[1]), TURNS)
    finally:
        for backend in remote:
            await backend.aclose()


@pytest.mark.model
@pytest.mark.server
def test_vllm_against_itself_and_against_the_model_here(
    vllm: VllmServer, local_backend: LocalBackend
) -> None:
    """vLLM against vLLM reads the same numbers: KL exactly 0. Against the model here
    (the Q4_1 file its weights were converted from): the same vocabulary, the
    distributions near but not the same, over each side's top 20."""
    same = asyncio.run(on_vllm(vllm, None))
    for t in same:
        assert t.divergence is not None, t.why
        assert t.taught is not None and t.taught.retokenized
        assert (t.divergence.kl_max, t.divergence.top1_agreement) == (0.0, 1.0)
        assert t.divergence.top_k == TOP_K
    here = asyncio.run(on_vllm(vllm, local_backend))
    for t in here:
        assert t.divergence is not None, t.why
        assert t.taught is not None and not t.taught.retokenized
        assert t.divergence.positions == len(t.taught.ids)
    d = overall(here)
    assert d is not None and d.kl_mean > 0 and d.top1_agreement >= 0.8
    assert d.bound == f"KL over each side's top {TOP_K} (a lower bound)"


@pytest.mark.model
@pytest.mark.server
async def test_d_on_a_comparison_with_llama_server(
    local_backend: LocalBackend, real_llama_server: str
) -> None:
    """The compare view of the model here against llama-server: `d` measures over each
    side's top 20, and the view says the KL is a lower bound."""
    remote = RemoteBackend(RemoteConfig(base_url=real_llama_server, name="llama-server"))
    app = PhasechatApp(settings=SETTINGS, backend=local_backend)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            c = Comparison(*sides_of(local_backend, remote), TURNS[0], together=False)
            screen = CompareScreen(c)
            await app.push_screen(screen)
            await wait_for(
                pilot, lambda: all(len(c.of(n)) == 1 and c.of(n)[0].done for n in (0, 1))
            )
            await pilot.pause()
            await pilot.press("d")
            view = app.screen
            assert isinstance(view, DivergenceView), "d is offered with a server side"
            await wait_for(pilot, lambda: view.divergence is not None or "no " in view.status)
            d = view.divergence
            assert d is not None, view.status
            tokens = c.of(0)[0].trace.answer_tokens
            assert tokens is not None and d.positions == len(tokens.ids)
            assert d.top_k == TOP_K and d.top1_agreement >= 0.9
            await pilot.pause()
            head = str(view.query_one("#head", Static).render())
            assert "top-1 agreement" in head and "a lower bound" in head
            assert "a request of its own" in head  # llama-server's caveat
            # the floor reads A again here: A is the model here, so `f` is offered
            assert view.check_action("floor", ()) is True
    finally:
        await remote.aclose()
