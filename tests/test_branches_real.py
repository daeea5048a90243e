"""Editing and retrying on real engines: the bundled model through llama-cpp-python, and
llama.cpp's own llama-server. An edit of question 2 in a 3-turn chat re-reads the prompt
from that question on only (the engine keeps the shared start cached), the old branch
stays whole in the database and in the export, and a retry keeps both answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from phasechat.backends.base import Backend
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.export import to_json
from phasechat.chat.store.writer import follow
from phasechat.chat.turns import TurnController
from tests.helpers import answer, ask

SETTINGS = Settings(system="You answer in one short sentence.", max_tokens=12, temperature=0)
QUESTIONS = ("What is a lighthouse?", "Where are they built?", "Who keeps them?")


async def edit_question_2(backend: Backend, db: Path) -> tuple[TurnController, int, ChatStore]:
    """A 3-turn chat saved to `db`, then question 2 edited (answered on a new branch)."""
    turns = TurnController(backend, SETTINGS)
    turns.trimmer.enabled = False  # the prompt is the whole chat: the cache arithmetic is plain
    store = ChatStore(db)
    chat_id = store.create_chat()
    follow(turns, store, chat_id)
    for q in QUESTIONS:
        await ask(turns, q)
    q2 = turns.conversation.questions()[1]
    await answer(turns, turns.edit(q2.id, "Where are lighthouses usually built?"))
    return turns, chat_id, store


def check_anatomy(turns: TurnController) -> None:
    """Every answer's sections add up to the engine's prompt count; the edit's cache
    break is at question 2 (message 3 of the request: system, q1, a1, q2) and quotes the
    words that changed; what it read again is what the engine held less what it kept."""
    for exchange in turns.exchanges:
        a, m = exchange.anatomy, exchange.metrics
        assert a is not None and m is not None and a.source in ("tokenizer", "server")
        assert a.prompt_tokens == m.prompt_tokens
        assert sum(s.cached_tokens or 0 for s in a.sections) == m.cached_tokens
        assert a.cache_break is None or exchange is turns.exchanges[3]
    third, edited = turns.exchanges[2], turns.exchanges[3]
    brk = edited.anatomy.cache_break if edited.anatomy else None
    assert brk is not None and brk.message_index == 3 and not brk.estimated
    assert "they" in brk.held and "lighthouses" in brk.sent
    m3, m4 = third.metrics, edited.metrics
    assert m3 is not None and m4 is not None and m3.prompt_tokens and m4.cached_tokens
    assert brk.tokens_read_again == m3.prompt_tokens + m3.output_tokens - m4.cached_tokens


def check_old_branch_kept(turns: TurnController, chat_id: int, store: ChatStore) -> None:
    """The edited chat's old branch is whole in the database and in the JSON export."""
    saved = store.open_chat(chat_id)
    chat = saved.conversation
    shown = [m.content for m in chat.messages]
    assert shown[0::2] == [QUESTIONS[0], "Where are lighthouses usually built?"]
    old_q2, new_q2 = chat.siblings(chat.messages[2])
    assert (old_q2.content, chat.branch_of(new_q2)) == (QUESTIONS[1], (2, 2))
    old_leaf = chat.children(chat.children(chat.children(old_q2.id)[0].id)[0].id)[0]
    old = [m.content for m in chat.path(old_leaf.id)]
    assert old[1::2] == list(QUESTIONS) and all(old[2::2])  # three questions, three answers
    doc = json.loads(to_json(store.get(chat_id), chat, saved.rows))
    exported = {m["id"]: m for m in doc["messages"]}
    assert len(exported) == 1 + 6 + 2  # the root, the old branch, the new question + answer
    assert exported[saved.rows[old_leaf.id]]["content"] == old[-1]
    assert doc["branch"] == [saved.rows[m.id] for m in chat.path()]


@pytest.mark.model
async def test_edit_of_question_2_rereads_from_there_on_the_bundled_model(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    turns, chat_id, store = await edit_question_2(local_backend, tmp_path / "chats.db")
    first, *_, third, edited = turns.exchanges
    m = edited.metrics
    assert m is not None and m.cached_tokens is not None and m.prompt_tokens is not None
    # What the engine held (turn 3's prompt, then its answer) and what the edit sent share
    # their tokens up to question 2: exactly that prefix is reused, the rest is read.
    assert third.request is not None and edited.request is not None
    held, sent = (
        local_backend.format_prompt(r.messages)[0] for r in (third.request, edited.request)
    )
    common = next((i for i, (a, b) in enumerate(zip(held, sent, strict=False)) if a != b), 0)
    assert m.cached_tokens == common
    assert first.metrics is not None and first.metrics.prompt_tokens is not None
    assert m.cached_tokens >= first.metrics.prompt_tokens  # turn 1 (and its answer) stayed
    assert m.evaluated_prompt_tokens == m.prompt_tokens - m.cached_tokens > 0
    check_anatomy(turns)
    check_old_branch_kept(turns, chat_id, store)

    # A retry keeps both answers to the edited question; its whole prompt was held.
    await answer(turns, turns.retry())
    retried = turns.exchanges[-1]
    assert turns.conversation.siblings(retried.answer) == [edited.answer, retried.answer]
    assert retried.metrics is not None and retried.metrics.prompt_tokens == m.prompt_tokens
    assert retried.metrics.cached_tokens is not None
    assert retried.metrics.cached_tokens >= m.prompt_tokens - 1  # llama.cpp re-reads one
    store.close()


@pytest.mark.server
async def test_edit_of_question_2_rereads_from_there_on_llama_server(
    start_llama_server: Callable[..., str], tmp_path: Path
) -> None:
    # a server of its own: another test's requests between these would evict the slot
    backend = RemoteBackend(RemoteConfig(base_url=start_llama_server("--parallel", "1")))
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    try:
        turns, chat_id, store = await edit_question_2(backend, tmp_path / "chats.db")
    finally:
        await backend.aclose()
    first, *_, edited = turns.exchanges
    m = edited.metrics
    assert m is not None and m.cached_tokens is not None and m.prompt_tokens is not None
    assert first.metrics is not None and first.metrics.prompt_tokens is not None
    # the server's own count (`timings.cache_n`): turn 1 stayed cached, the edit was read
    assert first.metrics.prompt_tokens <= m.cached_tokens < m.prompt_tokens
    assert (m.server_cache_n, m.server_prompt_n) == (m.cached_tokens, m.evaluated_prompt_tokens)
    check_anatomy(turns)
    check_old_branch_kept(turns, chat_id, store)
    store.close()


@pytest.mark.server
async def test_a_server_that_hides_its_cache_gets_no_cached_count_per_section(
    llama_server: str,
) -> None:
    """llama-cpp-python's server sends no usage and no timings: the sections are estimated
    and say nothing of the cache."""
    backend = RemoteBackend(RemoteConfig(base_url=llama_server))
    await backend.start()
    turns = TurnController(backend, SETTINGS)
    try:
        await ask(turns, QUESTIONS[0])
        await ask(turns, QUESTIONS[1])
    finally:
        await backend.aclose()
    for exchange in turns.exchanges:
        a, m = exchange.anatomy, exchange.metrics
        assert a is not None and m is not None and a.source == "estimate"
        assert a.prompt_tokens == m.prompt_tokens
        assert all(s.cached_tokens is None and s.evaluated_tokens is None for s in a.sections)
        assert a.cache_break is None
