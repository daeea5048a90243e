"""Issue 49, item 3: what chat/trips/forced_sides.py says and asks, word for word,
without the model: each reason a user reads in place of a divergence, the server and
messages each server call is given, a local side's defaults where its backend says
nothing, and a local side's logits made a top k before a server's are compared."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest

from phasechat.backends.events import AnswerTokens, Message
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.teacher import EngineSetting
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.servers.forcing import TOP_K, Forcing, Listed, Server
from phasechat.chat.trips.forced_sides import (
    Forced,
    Reader,
    Teaching,
    compared,
    forced_of,
    teaching,
    vocabulary_check,
    vocabulary_differs,
    why_unread,
)
from phasechat.telemetry.divergence import compare_top, top_of_logits
from tests.scripted import ScriptedBackend
from tests.test_engine_variants import tiny_gguf

QUESTION = (Message("user", "q"),)


def test_the_reason_for_other_vocabularies_names_each_side(tmp_path: Path) -> None:
    named = tiny_gguf(tmp_path / "named.gguf", ["<s>", "a"])
    bare = tiny_gguf(tmp_path / "bare.gguf", [])
    tail = (
        "B would read A's tokens as other text, so no divergence is measured; the speed "
        "figures stand"
    )
    digest = "<2 tokens, sha256 51949d111e17d2fd>"
    assert vocabulary_differs(named, bare) == (
        f"the models' vocabularies differ (named.gguf: {digest}; bare.gguf: none named): {tail}"
    )
    assert vocabulary_differs(bare, named) == (
        f"the models' vocabularies differ (bare.gguf: none named; named.gguf: {digest}): {tail}"
    )


def spelling(text: str, offset: int = 0) -> Forcing:
    """A server that spells every id sequence as `text` and splits a text into its
    bytes (plus `offset`); asserting it is asked about its own server and the question."""

    async def top(server: Server, *_: object) -> list[Listed]:
        return []

    async def tokenize(server: Server, said: str) -> tuple[list[int], tuple[bytes, ...]]:
        assert server.model != "", "asked without its server"
        return [b + offset for b in said.encode()], tuple(bytes([b]) for b in said.encode())

    async def detokenize(server: Server, ids: Sequence[int]) -> str:
        return text

    async def prompt_tokens(server: Server, messages: tuple[Message, ...]) -> list[int]:
        assert server.model != "" and messages == QUESTION
        return [len(messages[0].content)]

    return Forcing(top, tokenize, detokenize, prompt_tokens, "a lower bound")


def on(forcing: Forcing, name: str) -> Reader:
    return Reader(
        name, forcing=forcing, server=Server(httpx.AsyncClient(), "http://x/v1", {}, name)
    )


def test_another_vocabulary_on_a_server_is_said_in_full() -> None:
    t = Teaching((1,), (104, 105), (b"h", b"i"), retokenized=True)
    why = asyncio.run(vocabulary_check(on(spelling("hi"), "a"), on(spelling("ho"), "b"), t))
    assert why == (
        "B (b) reads A's answer ids as other text: not the same vocabulary, so no "
        "divergence is measured; the speed figures stand"
    )
    why = asyncio.run(vocabulary_check(on(spelling("hi"), "a"), on(spelling("hi", 1), "b"), t))
    assert why == (
        "A (a) and B (b) split the same text into other ids: not the same vocabulary, so "
        "no divergence is measured; the speed figures stand"
    )
    assert (
        asyncio.run(vocabulary_check(on(spelling("hi"), "a"), on(spelling("hi"), "b"), t)) is None
    )


def test_a_servers_sequence_is_asked_of_its_own_server_with_the_question() -> None:
    reader = on(spelling(""), "a")
    t = asyncio.run(teaching(reader, ScriptedBackend(), QUESTION, "hé", None))
    assert t == Teaching((1,), (104, 195, 169), (b"h", b"\xc3", b"\xa9"), retokenized=True)
    with pytest.raises(ValueError, match=r"^A's answer is empty$"):
        asyncio.run(teaching(reader, ScriptedBackend(), QUESTION, "", None))


def test_a_local_side_that_read_no_prompt_says_so_in_full(tmp_path: Path) -> None:
    reader = Reader("here", forced=Forced(tmp_path / "m.gguf", EngineSetting()))
    said = AnswerTokens((7,), (b"a",), "m.gguf")
    why = "A's model did not read the prompt (not loaded, or refused by its template)"
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        asyncio.run(teaching(reader, ScriptedBackend(), QUESTION, "a", said))


class Bare:
    """A local side that names its model file and config, and says nothing of its own
    engine yet (not loaded: no flash attention, no threads, no GPU layers): the members
    of `ModelFile` (backends/local/capability.py) at their "not loaded" values."""

    def __init__(self, path: Path) -> None:
        self.model_path = path
        self.config = LocalConfig(model_path=path)
        self.flash_attn: bool | None = None
        self.threads = 0
        self.gpu_layers = 0


class Partial:
    """A side that names a model file and nothing of the engine: not a local side."""

    def __init__(self, path: Path) -> None:
        self.model_path = path
        self.config = LocalConfig(model_path=path)


def test_a_local_side_that_says_nothing_else_is_read_with_llama_cpps_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.gguf"
    forced = forced_of(Bare(path))  # type: ignore[arg-type]
    assert forced == Forced(path, EngineSetting())
    assert forced is not None and forced.setting.threads is None
    assert (forced.setting.gpu_layers, forced.setting.flash_attn) == (0, None)
    # a side without the engine's members is no local side (a protocol, not a probe)
    assert forced_of(Partial(path)) is None  # type: ignore[arg-type]


def test_a_server_that_gives_no_log_probabilities_says_which_do() -> None:
    backend = RemoteBackend(RemoteConfig(base_url="http://127.0.0.1:9/v1", name="plain"))
    assert why_unread(backend) == (
        "OpenAI-compatible gives no log-probabilities of tokens it did not sample (vLLM "
        "and llama-server do)"
    )


def test_the_model_here_against_a_server_is_compared_over_its_top_k() -> None:
    """A side's logits over more tokens than the server lists are made its top 20
    before the KL: over all of them the figure would be another."""
    rng = np.random.default_rng(49)
    here = rng.normal(0, 2, (3, 40))
    there = top_of_logits(rng.normal(0, 2, (3, 40)), TOP_K)
    d = compared(here, there)
    assert d.top_k == TOP_K
    assert d.kl == pytest.approx(compare_top(top_of_logits(here, TOP_K), there).kl)
    assert d.kl != pytest.approx(compare_top(top_of_logits(here, 40), there).kl)
