"""Token-exact history on the bundled model: an answer goes back to the engine that
wrote it as its own token ids (backends/local/prompts.py), so a sampled answer that the
tokenizer would split otherwise is not read again; and a cache break whose text is the
same on both sides is named a re-tokenization (telemetry/anatomy.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from phasechat.backends.events import AnswerTokens, Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.prompts import answer_span
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import Exchange, TurnController

QUESTIONS = (
    "Explain the KV cache in one paragraph.",
    "What is a token?",
    "Why do models sample?",
    "Write two lines about the sea.",
    "What is decode, briefly?",
    "Name a prime number and say why it is prime.",
    "How does a CPU cache work?",
    "What is the capital of Italy?",
    "Describe a cat in one sentence.",
    "Thank you, goodbye.",
)


def test_the_answers_ids_are_the_run_that_spells_its_text() -> None:
    t = AnswerTokens((1, 2, 3, 4), (b"<think>x</think>", b"K", b"VC", b"\nUser:"), "v")
    assert answer_span(t, b"KVC") == [2, 3]  # after the thinking, before a stop string
    assert answer_span(t, b"KV") is None  # it ends inside a token: no ids spell it
    assert answer_span(t, b"VC\nUser:") == [3, 4]
    assert answer_span(AnswerTokens((1,), (b"a", b"b"), "v"), b"a") is None  # not one each


async def say(turns: TurnController, text: str) -> Exchange:
    exchange = turns.begin(text)
    async for _ in turns.run(exchange):
        pass
    return exchange


@pytest.fixture(scope="module")
def two_threads(model_path: Path) -> Iterator[LocalBackend]:
    """The bundled model on exactly 2 threads: a fixed seed then gives the same answers
    run after run (the adaptive thread count of `local_backend` changes the sums)."""
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=2048, threads=2))
    asyncio.run(backend.start())
    assert backend.state == "ready", backend.state_detail
    yield backend
    asyncio.run(backend.aclose())


@pytest.mark.model
async def test_a_ten_turn_sampled_chat_reads_no_history_again(two_threads: LocalBackend) -> None:
    """Every turn reuses all the engine held (the last prompt and answer); only the new
    message and the template's tail are read. At the default temperature and seed 7 one
    answer is one the tokenizer splits otherwise: sent as text, it would have been read
    again from there."""
    turns = TurnController(two_threads, Settings(seed=7, max_tokens=120))
    turns.trimmer.enabled = False
    held, split_otherwise = 0, 0
    for question in QUESTIONS:
        exchange = await say(turns, question)
        trace, answer = exchange.trace, exchange.answer
        assert trace.prompt is not None and trace.kv is not None, trace.error
        assert trace.prompt.cached_tokens == held, question  # nothing held was read again
        assert exchange.anatomy is not None and exchange.anatomy.cache_break is None
        assert answer.tokens is not None and answer.tokens.vocab == two_threads.vocab
        plain = two_threads.format_prompt((Message("assistant", answer.content),))[0]
        spliced = two_threads.format_prompt((answer.as_message(),))[0]
        llm = two_threads._llm
        assert llm.detokenize(spliced) == llm.detokenize(plain)  # the same text, either way
        split_otherwise += plain != spliced
        held = trace.kv.used_tokens
    assert split_otherwise >= 1, "no answer was split otherwise: the test proved nothing"


@pytest.mark.model
async def test_spliced_ids_read_as_the_plain_prompt_or_are_not_used(
    local_backend: LocalBackend,
) -> None:
    question = Message("user", "Explain the KV cache in one paragraph.")
    ids = local_backend.format_prompt((Message("user", "KVC"),))[0]
    text = "The KVC is a cache."
    pieces = local_backend.format_prompt((question, Message("assistant", text)))[0]
    odd = _odd_split(local_backend, text)
    llm = local_backend._llm
    sent = (question, Message("assistant", text, odd), Message("user", "More?"))
    plain = (question, Message("assistant", text), Message("user", "More?"))
    spliced, _ = local_backend.format_prompt(sent)
    tokens, _ = local_backend.format_prompt(plain)
    canonical = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert spliced != tokens and len(spliced) - len(tokens) == len(odd.ids) - len(canonical)
    assert llm.detokenize(spliced) == llm.detokenize(tokens)
    # another engine's ids, or ids of another text, are not used
    other = AnswerTokens(odd.ids, odd.pieces, "another model")
    assert (
        local_backend.format_prompt((*plain[:1], Message("assistant", text, other), plain[2]))[0]
        == tokens
    )
    edited = (question, Message("assistant", text + " Edited.", odd), Message("user", "More?"))
    assert (
        local_backend.format_prompt(edited)[0]
        == local_backend.format_prompt(
            (question, Message("assistant", text + " Edited."), Message("user", "More?"))
        )[0]
    )
    assert ids and pieces  # the tokenizer is the real one


def _odd_split(backend: LocalBackend, text: str) -> AnswerTokens:
    """`text` as tokens the tokenizer would not choose: its first token of two or more
    letters cut into its first letter and the rest."""
    llm = backend._llm
    ids = list(llm.tokenize(text.encode(), add_bos=False, special=False))
    pieces = [llm.detokenize([t]) for t in ids]
    at = next(i for i, p in enumerate(pieces) if len(p.strip()) >= 2 and p.strip().isalpha())
    head, rest = pieces[at][:-1], pieces[at][-1:]
    cut = [*llm.tokenize(head, add_bos=False, special=False), *llm.tokenize(rest, add_bos=False)]
    assert len(cut) >= 2, cut
    odd = [*ids[:at], *cut, *ids[at + 1 :]]
    return AnswerTokens(tuple(odd), tuple(llm.detokenize([t]) for t in odd), backend.vocab)


@pytest.mark.model
async def test_a_plain_next_turn_has_no_break_even_after_a_first_turn_that_loaded_the_model(
    model_path: Path,
) -> None:
    """The first turn is sent while the model loads: its prompt is rendered once the
    load is done, so what the engine held is the templated text the next turn is."""
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=1024))
    try:
        turns = TurnController(backend, Settings(seed=3, max_tokens=40))
        loading = asyncio.ensure_future(backend.start())  # as the UI starts it
        await asyncio.sleep(0)
        first = turns.begin("Explain the KV cache in one paragraph.")
        assert backend.state == "loading"  # the first send waits for the load
        async for _ in turns.run(first):
            pass
        await loading
        assert first.trace.error is None
        assert first.anatomy is not None and first.anatomy.source == "tokenizer"
        second = await say(turns, "Name three colors.")
        assert second.anatomy is not None and second.anatomy.cache_break is None
        assert second.trace.prompt is not None and second.trace.prompt.cached_tokens > 0
    finally:
        await backend.aclose()


@pytest.mark.model
async def test_an_answer_held_in_another_split_is_named_a_retokenization(
    local_backend: LocalBackend,
) -> None:
    """The engine holds an answer as it sampled it; the next prompt sends the same
    text as a split the tokenizer would not choose: the break is named for that."""
    turns = TurnController(local_backend, Settings(seed=5, max_tokens=60, temperature=0.0))
    turns.trimmer.enabled = False
    first = await say(turns, "Explain the KV cache in one paragraph.")
    answer = first.answer
    assert answer.tokens is not None
    odd = _odd_split(local_backend, answer.content)
    request = first.request
    assert request is not None
    again = turns.ask_over(
        (*request.messages, Message("assistant", answer.content, odd), Message("user", "More?"))
    )
    async for _ in turns.run(again):
        pass
    assert again.anatomy is not None
    brk = again.anatomy.cache_break
    assert brk is not None and brk.kind == "retokenized" and brk.in_answer
    assert brk.line().startswith("the previous answer was tokenized differently at ‹")
    # the engine's split of those letters, then the one sent, spell the same text
    assert brk.held.replace("|", "") == brk.sent.replace("|", "") and brk.held != brk.sent
    m = again.metrics
    assert m is not None and first.metrics is not None
    assert first.metrics.prompt_tokens is not None and m.cached_tokens is not None
    held = first.metrics.prompt_tokens + first.metrics.output_tokens
    assert brk.tokens_read_again == held - m.cached_tokens


@pytest.mark.server
async def test_llama_server_holding_an_answer_in_another_split_names_the_retokenization(
    start_llama_server: Callable[..., str],
) -> None:
    """llama-server does not say which ids it sampled: the break is placed where its
    cached count ends, inside the previous answer whose text is the same. The server is
    made to hold the answer as a split its tokenizer would not choose by a `/completion`
    of the same prompt as token ids (as if it had sampled that split)."""
    # a server of its own, whose slot holds the last request only: with its prompt
    # cache (--cache-ram) it would restore the first turn's state, split as sampled
    url = start_llama_server("--parallel", "1", "--cache-ram", "0")
    backend = RemoteBackend(RemoteConfig(base_url=url))
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    root = url.removesuffix("/v1")
    try:
        turns = TurnController(backend, Settings(max_tokens=40, temperature=0))
        turns.trimmer.enabled = False
        first = await say(turns, "Explain the KV cache in one paragraph.")
        assert first.rendered is not None and first.answer.content
        async with httpx.AsyncClient(timeout=60) as client:

            async def tokenize(text: str) -> list[dict[str, Any]]:
                r = await client.post(
                    f"{root}/tokenize", json={"content": text, "with_pieces": True}
                )
                out: list[dict[str, Any]] = r.json()["tokens"]
                return out

            prompt = [t["id"] for t in await tokenize(first.rendered.text)]
            answer = await tokenize(first.answer.content)
            at = next(i for i, t in enumerate(answer) if len(t["piece"].strip()) >= 2)
            piece = answer[at]["piece"]
            cut = [t["id"] for t in await tokenize(piece[:-1]) + await tokenize(piece[-1:])]
            odd = [t["id"] for t in answer[:at]] + cut + [t["id"] for t in answer[at + 1 :]]
            r = await client.post(
                f"{root}/completion",
                json={"prompt": prompt + odd, "n_predict": 1, "cache_prompt": True},
            )
            assert r.status_code == 200
        second = await say(turns, "Name three colors.")
    finally:
        await backend.aclose()
    assert second.anatomy is not None and second.anatomy.source == "server"
    brk = second.anatomy.cache_break
    assert brk is not None and brk.kind == "retokenized" and brk.in_answer, brk
    assert brk.line().startswith("the previous answer was tokenized differently at ‹")
    m, held = second.metrics, first.metrics
    assert m is not None and held is not None and held.prompt_tokens is not None
    assert m.cached_tokens is not None
    # the server kept the prompt and the answer up to the split, and read the rest again
    assert held.prompt_tokens + at <= m.cached_tokens < held.prompt_tokens + len(answer)
    assert brk.tokens_read_again == held.prompt_tokens + held.output_tokens - m.cached_tokens
