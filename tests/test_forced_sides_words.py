"""Issue 49, item 3: what chat/trips/forced_sides.py says and asks, word for word,
without the model: each reason a user reads in place of a divergence, the server and
messages each server call is given, a local side's defaults where its backend says
nothing, and a local side's logits made a top k before a server's are compared."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from phasechat.backends.events import AnswerTokens, Message
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.teacher import EngineSetting
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.servers.forcing import TOP_K, Forcing, Listed, Server
from phasechat.chat.trips import forced_sides
from phasechat.chat.trips.forced_sides import (
    Forced,
    Reader,
    Teaching,
    compared,
    floor,
    forced_of,
    measure,
    read,
    reader_of,
    teaching,
    vocabulary_check,
    vocabulary_differs,
    why_unread,
)
from phasechat.telemetry.divergence import compare_top, top_of_logits
from tests.scripted import ScriptedBackend
from tests.shaped import Shaped
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


# -- the model here, read without the model: forced_logits and the vocabulary as calls ---

#: two asymmetric distributions over three tokens: KL(A||B) is not KL(B||A)
A_P, B_P = (0.7, 0.2, 0.1), (0.4, 0.5, 0.1)
KL_AB = sum(p * math.log(p / q) for p, q in zip(A_P, B_P, strict=True))


class Logits:
    """forced_logits as teacher forcing calls it, without the model: each call's model,
    setting, sequence, start and stop kept, its progress told once, the whole sequence
    read; A_P at every position for llama.cpp's default setting, B_P for any other."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, EngineSetting, list[int], int, object]] = []

    def __call__(
        self,
        model: Path,
        setting: EngineSetting,
        tokens: Sequence[int],
        start: int,
        progress: Callable[[int, int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Any:
        self.calls.append((model, setting, list(tokens), start, stop))
        if progress is not None:
            progress(len(tokens) - 1, len(tokens) - 1)
        p = A_P if setting == EngineSetting() else B_P
        return np.log(np.array([p] * (len(tokens) - start)))


class Vocab:
    """A model file's vocabulary, as llama.cpp's Llama(vocab_only=True) is used: each
    id one byte; a BOS (id 1) before a text only where asked."""

    def detokenize(self, ids: list[int]) -> bytes:
        return bytes(ids)

    def tokenize(self, text: bytes, add_bos: bool = True) -> list[int]:
        return [1] * bool(add_bos) + list(text)


@pytest.fixture
def logits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Logits:
    """forced_logits and the vocabulary of `tmp_path / "m.gguf"` without the model."""
    said = Logits()
    monkeypatch.setattr(forced_sides, "forced_logits", said)

    def local_vocab(path: Path, use: Callable[[Any], Any]) -> Any:
        assert path == tmp_path / "m.gguf", path
        return use(Vocab())

    monkeypatch.setattr(forced_sides, "_local_vocab", local_vocab)
    return said


def by_bytes(kept: list[object]) -> Forcing:
    """A server of the same vocabulary as `Vocab` (each id one byte) whose top k is B_P
    everywhere; the stop each read is given kept in `kept`."""

    async def top(
        server: Server,
        tokens: Sequence[int],
        start: int,
        progress: Callable[[int, int], None] | None,
        stop: threading.Event | None,
    ) -> list[Listed]:
        kept.append(stop)
        if progress is not None:
            progress(len(tokens) - 1, len(tokens) - 1)
        return [{i: math.log(p) for i, p in enumerate(B_P)}] * (len(tokens) - start)

    async def tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
        return list(text.encode()), tuple(bytes([b]) for b in text.encode())

    async def detokenize(server: Server, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", "replace")

    async def prompt_tokens(server: Server, messages: tuple[Message, ...]) -> list[int]:
        return [1]

    return Forcing(top, tokenize, detokenize, prompt_tokens, "a lower bound")


T = Teaching((1, 2), (104, 105), (b"h", b"i"))


def test_two_sides_here_are_read_each_with_its_setting_label_and_stop(
    logits: Logits, tmp_path: Path
) -> None:
    path = tmp_path / "m.gguf"  # one file: one vocabulary
    a = Reader("here", forced=Forced(path, EngineSetting()))
    b = Reader("here", forced=Forced(path, EngineSetting(kv="q8_0")))
    stop, seen = threading.Event(), list[tuple[object, ...]]()
    d, why = asyncio.run(measure(a, b, T, lambda *p: seen.append(p), stop))
    assert why is None and d is not None and d.kl == pytest.approx((KL_AB, KL_AB))
    sequence = [1, 2, 104, 105]
    assert logits.calls == [
        (path, EngineSetting(), sequence, 2, stop),
        (path, EngineSetting(kv="q8_0"), sequence, 2, stop),
    ]
    assert seen == [("A", 3, 3), ("B", 3, 3)]
    # without a progress to tell, and read alone
    d, why = asyncio.run(measure(a, b, T))
    assert why is None and d is not None
    got = asyncio.run(read(b, T, lambda *p: seen.append(p), stop))
    assert isinstance(got, np.ndarray) and got.shape == (2, 3)
    assert logits.calls[-1] == (path, EngineSetting(kv="q8_0"), sequence, 2, stop)
    assert seen[-1] == (3, 3)


def test_the_floor_reads_a_s_setting_a_token_a_step_against_its_prefill(
    logits: Logits, tmp_path: Path
) -> None:
    path = tmp_path / "m.gguf"
    a = Reader("here", forced=Forced(path, EngineSetting()))
    stop, seen = threading.Event(), list[tuple[object, ...]]()
    below = floor(a, T, lambda *p: seen.append(p), stop)
    assert below is not None and below.kl == pytest.approx((KL_AB, KL_AB))
    sequence = [1, 2, 104, 105]
    assert logits.calls == [
        (path, EngineSetting(), sequence, 2, stop),
        (path, EngineSetting(batch=1), sequence, 2, stop),
    ]
    assert seen == [("A", 3, 3), ("A, a token a step", 3, 3)]


def test_the_model_here_and_a_server_of_its_vocabulary_each_way_round(
    logits: Logits, tmp_path: Path
) -> None:
    here = Reader("here", forced=Forced(tmp_path / "m.gguf", EngineSetting()))
    stops: list[object] = []
    there = on(by_bytes(stops), "s")
    for a, b in ((here, there), (there, here)):
        assert asyncio.run(vocabulary_check(a, b, T)) is None
    # an answer cut inside a character: its bytes are no UTF-8, spelled alike either way
    cut = Teaching((1,), (0xE6, 0x97), (b"\xe6", b"\x97"), retokenized=True)
    for a, b in ((here, there), (there, here)):
        assert asyncio.run(vocabulary_check(a, b, cut)) is None
    stop, seen = threading.Event(), list[tuple[object, ...]]()
    d, why = asyncio.run(measure(here, there, T, lambda *p: seen.append(p), stop))
    assert why is None and d is not None and d.kl == pytest.approx((KL_AB, KL_AB))
    assert seen == [("A", 3, 3), ("B", 3, 3)] and stops == [stop]
    assert logits.calls == [(tmp_path / "m.gguf", EngineSetting(), [1, 2, 104, 105], 2, stop)]


def test_a_vocabulary_here_that_spells_or_splits_otherwise_is_another(
    logits: Logits, tmp_path: Path
) -> None:
    here = Reader("here", forced=Forced(tmp_path / "m.gguf", EngineSetting()))
    other = dataclasses.replace(by_bytes([]), detokenize=spelling("ho").detokenize)
    why = asyncio.run(vocabulary_check(here, on(other, "s"), T))
    assert why is not None and why.startswith("B (s) reads A's answer ids as other text")
    shifted = dataclasses.replace(by_bytes([]), tokenize=spelling("", 1).tokenize)
    why = asyncio.run(vocabulary_check(on(shifted, "s"), here, T))
    assert why is not None and why.startswith("A (s) and B (here) split the same text")


def test_sides_of_other_vocabularies_are_not_measured(logits: Logits, tmp_path: Path) -> None:
    a = Forced(tiny_gguf(tmp_path / "a.gguf", ["<s>", "a"]), EngineSetting())
    b = Forced(tiny_gguf(tmp_path / "b.gguf", ["<s>", "b"]), EngineSetting())
    d, why = asyncio.run(measure(Reader("a", forced=a), Reader("b", forced=b), T))
    assert d is None and why is not None and "vocabularies differ" in why
    assert logits.calls == []
    t = Teaching((1,), (104, 105), (b"h", b"i"), retokenized=True)
    d, why = asyncio.run(measure(on(spelling("hi"), "a"), on(spelling("ho"), "b"), t))
    assert d is None and why is not None and why.startswith("B (b) reads A's answer ids")


class Templated(ScriptedBackend):
    """A side here whose template makes one id of each message's length."""

    async def prompt_ids(self, messages: tuple[Message, ...]) -> list[int]:
        return [len(m.content) for m in messages]


def test_the_model_here_reads_the_prompt_its_template_makes_of_the_question(
    tmp_path: Path,
) -> None:
    reader = Reader("here", forced=Forced(tmp_path / "m.gguf", EngineSetting()))
    said = AnswerTokens((7,), (b"a",), "m.gguf")
    question = (Message("user", "abc"), Message("user", "de"))
    t = asyncio.run(teaching(reader, Templated(), question, "a", said))
    assert t == Teaching((3, 2), (7,), (b"a",))


def test_a_server_is_read_as_its_family_at_its_url() -> None:
    models = [{"id": "m", "object": "model", "owned_by": "llamacpp"}]
    backend = Shaped(models, lambda body: b"").backend(model="m")
    asyncio.run(backend.start())
    reader = reader_of(backend)
    assert reader is not None and reader.name == "llama-server" and not reader.whole
    assert reader.forcing is backend.family.forcing and reader.forcing is not None
    assert reader.server is not None
    assert (reader.server.root, reader.server.model) == ("http://shaped.test", "m")
