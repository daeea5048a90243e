"""Issue 39, remote divergence sources (backends/remote/servers/forcing.py and each family's
teacher.py): each answer position's top-k log-probabilities from vLLM's
`prompt_logprobs` and from llama-server's `n_probs`, compared over the tokens both sides
list plus a rest bucket (telemetry/divergence.py `compare_top`); what a server sends is
checked."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from phasechat.backends.local.teacher import EngineSetting, forced_logits
from phasechat.backends.remote.servers.forcing import Server, TeacherError
from phasechat.backends.remote.servers.llama_server.teacher import llama_server_top
from phasechat.backends.remote.servers.vllm.teacher import vllm_top
from phasechat.telemetry.divergence import compare_logits, compare_top, top_of_logits
from tests.vllm_server import MODEL, VllmServer


def test_the_top_k_kl_keeps_the_rest_of_each_sides_mass_in_one_bucket() -> None:
    a = [{0: math.log(0.5), 1: math.log(0.3)}, {5: math.log(0.6), 6: math.log(0.3)}]
    b = [{0: math.log(0.4), 2: math.log(0.3)}, {6: math.log(0.7), 5: math.log(0.2)}]
    d = compare_top(a, b)
    # position 1: token 0 on both lists; the rest: A 0.5, B 0.6
    # KL = 0.5 ln(0.5/0.4) + 0.5 ln(0.5/0.6) = 0.020411 (renormalising over token 0
    # alone would give 0; over each side's own list, another figure again)
    first = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)
    assert d.kl[0] == pytest.approx(first) and d.kl[0] == pytest.approx(0.020411, abs=1e-6)
    # position 2: both list 5 and 6; the rest: A 0.1, B 0.1; the top choices swap
    second = 0.6 * math.log(0.6 / 0.2) + 0.3 * math.log(0.3 / 0.7) + 0.1 * math.log(0.1 / 0.1)
    assert d.kl[1] == pytest.approx(second)
    assert d.agree == (True, False) and d.first_divergence == 1 and d.kl_max_at == 1
    same = compare_top(a, a)
    assert (same.kl_max, same.top1_agreement, same.first_divergence) == (0.0, 1.0, None)
    with pytest.raises(ValueError, match="not the same positions"):
        compare_top(a, a[:1])


def test_a_local_sides_logits_become_its_top_k() -> None:
    logits = np.array([[0.0, 2.0, 1.0, -1.0]])
    top = top_of_logits(logits, 2)
    z = math.log(1 + math.e**2 + math.e + math.e**-1)
    assert list(top[0]) == [1, 2]  # the most likely first
    assert top[0][1] == pytest.approx(2 - z) and top[0][2] == pytest.approx(1 - z)
    # every token listed: the top-k KL is the full KL
    full = np.array([[0.0, 2.0, 1.0, -1.0], [1.0, 0.0, 0.5, 0.2]])
    other = full[::-1].copy()
    exact = compare_logits(full, other)
    listed = compare_top(top_of_logits(full, 4), top_of_logits(other, 4))
    assert listed.kl == pytest.approx(exact.kl)


def answering(body: Any) -> httpx.AsyncClient:
    """A client whose every request gets `body` (a server's JSON), HTTP 200."""

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(body).encode())

    return httpx.AsyncClient(transport=httpx.MockTransport(reply))


def vllm_answer(entries: list[Any]) -> dict[str, Any]:
    return {"choices": [{"prompt_logprobs": [None, *entries]}]}


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"7": {"logprob": 0.5}}, "not a log-probability"),
        ({"7": {"logprob": float("nan")}}, "not a log-probability"),
        ({"7": {"logprob": "-1.0"}}, "not a number"),
        ({"7": {"logprob": True}}, "not a number"),
        ({"-3": {"logprob": -1.0}}, "is not a number"),
        ({"7": {"rank": 1}}, "has no 'logprob'"),
        ({"7": {"logprob": -0.1}, "8": {"logprob": -0.2}}, "add up to more than 1"),
        ("text", "is not an object"),
    ],
)
def test_what_vllm_sends_is_checked(entry: Any, why: str) -> None:
    async def read() -> None:
        async with answering(vllm_answer([entry])) as client:
            await vllm_top(Server(client, "http://x/v1", {}, "m"), [1, 2], 1)

    with pytest.raises(TeacherError, match=why):
        asyncio.run(read())


def test_a_server_answer_of_the_wrong_shape_is_refused() -> None:
    async def read(body: Any, server: str) -> None:
        async with answering(body) as client:
            if server == "vllm":
                await vllm_top(Server(client, "http://x/v1", {}, "m"), [1, 2, 3], 1)
            else:
                await llama_server_top(Server(client, "http://x/v1", {}, ""), [1, 2, 3], 1)

    with pytest.raises(TeacherError, match="other than the 3 tokens"):
        asyncio.run(read(vllm_answer([{"7": {"logprob": -1.0}}]), "vllm"))
    with pytest.raises(TeacherError, match="no choices"):
        asyncio.run(read({"error": "busy"}, "vllm"))
    with pytest.raises(TeacherError, match="no completion_probabilities"):
        asyncio.run(read({"content": "x"}, "llama-server"))
    with pytest.raises(TeacherError, match="listed no tokens"):
        asyncio.run(read({"completion_probabilities": [{"top_logprobs": []}]}, "llama-server"))

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="out of memory")

    async def failing() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            await llama_server_top(Server(client, "http://x", {}, ""), [1, 2], 1)

    with pytest.raises(TeacherError, match="HTTP 500"):
        asyncio.run(failing())


def lighthouse(model_path: Path) -> tuple[list[int], int]:
    """A prompt and an answer as the bundled model's tokens, and where the answer starts."""
    from llama_cpp import Llama

    tok = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    prompt = tok.tokenize(b"The lighthouse keeper climbed the stairs every evening to")
    answer = tok.tokenize(b" light the lamp and watch the ships pass the rocks.", add_bos=False)
    return prompt + answer, len(prompt)


@pytest.mark.server
def test_llama_server_position_by_position_agrees_with_the_local_model(
    real_llama_server: str, model_path: Path
) -> None:
    """The same GGUF through llama-server, one request a position, against llama.cpp's
    one evaluation here, with the same flash attention: the same most likely token at
    every position and a KL near 0 (a batch of one token is another order of sums than
    one prefill, not another model)."""
    tokens, start = lighthouse(model_path)
    done: list[tuple[int, int]] = []

    async def read() -> list[dict[int, float]]:
        async with httpx.AsyncClient(timeout=60) as client:
            server = Server(client, real_llama_server, {}, "")
            return await llama_server_top(
                server, tokens, start, progress=lambda d, t: done.append((d, t))
            )

    server = asyncio.run(read())
    n = len(tokens) - start
    assert len(server) == n and done[-1] == (n, n)
    assert all(len(position) == 20 for position in server)
    # llama-server's default: flash attention where it can (on, on this CPU)
    setting = EngineSetting(kv="f16", flash_attn=True, threads=2)
    local = forced_logits(model_path, setting, tokens, start)
    d = compare_top(top_of_logits(local, 20), server)
    # measured: KL max 4.7e-7 nats (with flash attention off here: 0.016, a setting's
    # own effect, which a bound of 1e-5 tells apart)
    assert d.top1_agreement == 1.0 and d.kl_max < 1e-5


@pytest.mark.server
def test_vllm_reads_the_answer_in_one_request_the_same_twice(
    vllm: VllmServer, model_path: Path
) -> None:
    """vLLM's prompt_logprobs for the whole answer in one prefill: twice the same numbers
    (KL exactly 0); against the local Q4_1 model, the weights vLLM serves were converted
    from, the distributions are near but not the same."""
    tokens, start = lighthouse(model_path)

    async def read() -> list[dict[int, float]]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await vllm_top(Server(client, vllm.base_url, {}, MODEL), tokens, start)

    first, second = asyncio.run(read()), asyncio.run(read())
    assert len(first) == len(tokens) - start
    same = compare_top(first, second)
    assert (same.kl_max, same.top1_agreement) == (0.0, 1.0)
    # each position lists the top 20, and the token that is there when it is not among them
    assert all(len(p) in (20, 21) for p in first)
    assert all(tokens[start + i] in p for i, p in enumerate(first))
    local = forced_logits(model_path, EngineSetting(kv="f16", threads=2), tokens, start)
    d = compare_top(top_of_logits(local, 20), first)
    assert d.kl_mean > 0 and d.top1_agreement >= 0.8


def test_a_refusal_that_echoes_the_key_is_shown_without_it() -> None:
    key = "sk-teacher-0123456789abcdef"

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, text=f"invalid key {request.headers['Authorization']}")

    async def read() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            headers = {"Authorization": f"Bearer {key}"}
            server = Server(client, "http://x/v1", headers, "m", lambda s: s.replace(key, "***"))
            await vllm_top(server, [1, 2], 1)

    with pytest.raises(TeacherError, match="HTTP 401") as said:
        asyncio.run(read())
    assert key not in str(said.value) and "***" in str(said.value)
