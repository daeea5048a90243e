"""The history trimmer, against the real bundled model (n_ctx 2048).

A module fixture plays one chat under a small budget so that it trims twice or more;
several tests read that one run. The only scripted backend is the broken summarizer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from phasechat.backends.base import LoadState, RenderedPrompt, TokenCount
from phasechat.backends.events import Event, GenerationRequest, Message, StreamError
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.tokens import estimate_messages
from phasechat.chat.config.settings import Settings
from phasechat.chat.trim.summarize import SUMMARY_HEADER
from phasechat.chat.trim.trimmer import DEFAULT_CONTEXT, ESTIMATE_SLACK, MARGIN, Trimmer
from phasechat.chat.turns import Exchange, TurnController
from phasechat.cli.main import main

pytestmark = pytest.mark.model

BUDGET = 320
SUMMARY_TOKENS = 24
SYSTEM = "You are a helpful assistant. Answer in one sentence."
TURNS = [
    "My name is Rosa and I keep bees in Porto.",
    "How many hives can a beginner manage?",
    "What do bees need in winter?",
    "Which flowers should I plant for them?",
    "How do I know if a hive is queenless?",
    "What is a swarm and why does it happen?",
    "How much honey does one hive give in a year?",
    "What tools do I need for the first harvest?",
    "Is varroa a problem in Portugal?",
    "Should I wear gloves when I open a hive?",
    "When is the best month to split a strong colony?",
    "What was my name and where do I keep bees?",
]


async def say(turns: TurnController, text: str) -> Exchange:
    async for _ in turns.send(text):
        pass
    return turns.exchanges[-1]


@dataclass
class Played:
    turns: TurnController
    tokens: list[list[int]] = field(default_factory=list)  # formatted prompt of each send
    snapshots: list[list[tuple[int, str, str]]] = field(default_factory=list)


@pytest.fixture(scope="module")
def played(local_backend: LocalBackend) -> Played:
    """Twelve turns under a 320-token budget, summaries on the chat's own local model."""

    async def play() -> Played:
        turns = TurnController(local_backend, Settings(system=SYSTEM, max_tokens=24, temperature=0))
        turns.trimmer.budget, turns.trimmer.keep_last = BUDGET, 2
        turns.trimmer.summary_tokens = SUMMARY_TOKENS  # short summaries: a quicker test
        out = Played(turns)
        for text in TURNS:
            e = await say(turns, text)
            assert e.request is not None
            out.tokens.append(local_backend.format_prompt(e.request.messages)[0])
            out.snapshots.append([(m.id, m.role, m.content) for m in turns.conversation.messages])
        await turns.aclose()
        return out

    return asyncio.run(play())


def test_budget_is_context_minus_answer_minus_margin(local_backend: LocalBackend) -> None:
    t = Trimmer()
    assert t.budget_for(local_backend, 64) == 2048 - 64 - MARGIN
    assert t.summary_budget(t.budget_for(local_backend, 64)) == 240  # an eighth, under 256
    t.context = 1024
    assert t.budget_for(local_backend, 100) == 1024 - 100 - MARGIN
    t.budget = 500
    assert t.budget_for(local_backend, 100) == 500
    assert t.summary_budget(500) == 62
    # A remote endpoint does not say its window, and its counts are tiktoken estimates.
    remote = RemoteBackend(RemoteConfig())
    t = Trimmer()
    slack = int(DEFAULT_CONTEXT * ESTIMATE_SLACK)
    assert t.budget_for(remote, 512) == DEFAULT_CONTEXT - 512 - MARGIN - slack
    count = remote.count_tokens((Message("user", "hello there"),))
    assert count.estimated and not local_backend.count_tokens((Message("user", "hi"),)).estimated


def test_summary_sits_after_system_and_recent_turns_stay_verbatim(played: Played) -> None:
    turns = played.turns
    trimmer = turns.trimmer
    assert len(trimmer.summaries) >= 2, "the chat should have trimmed at least twice"
    trimmed = [e for e in turns.exchanges if e.trimmed]
    assert trimmed
    for e in trimmed:
        assert e.request is not None
        msgs = e.request.messages
        # one system message, first: the user's system prompt byte-identical at its start,
        # then the summary (strict templates accept exactly this)
        assert msgs[0].role == "system" and msgs[0].content.startswith(SYSTEM + "\n\n")
        assert msgs[0].content[len(SYSTEM) + 2 :].startswith(SUMMARY_HEADER)
        assert [m.role for m in msgs].count("system") == 1
        roles = [m.role for m in msgs[1:]]
        assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    # The latest request: the summary in use, then every uncovered message verbatim.
    last = turns.exchanges[-1]
    assert last.request is not None
    assert trimmer.summary is not None
    assert last.request.messages[0] == trimmer.summary.system(SYSTEM)
    kept = [m for m in turns.conversation.messages[:-1] if m.id not in trimmer.covered]
    assert last.request.messages[1:] == tuple(Message(m.role, m.content) for m in kept)
    users = [m.content for m in last.request.messages if m.role == "user"]
    assert users[-trimmer.keep_last :] == TURNS[-trimmer.keep_last :]
    # Trims cut deep (to about half the budget), not one turn at a time.
    for e in trimmed:
        assert e.trace.prompt_estimate is not None
        assert e.trace.prompt_estimate <= 0.6 * BUDGET


def test_prompt_prefix_is_byte_identical_between_trims(
    played: Played, local_backend: LocalBackend
) -> None:
    exchanges = played.turns.exchanges
    pairs = 0
    for k in range(len(exchanges) - 1):
        if exchanges[k + 1].trimmed:
            continue
        before, after = played.tokens[k], played.tokens[k + 1]
        assert after[: len(before)] == before, f"turn {k + 2} rewrote the prompt's prefix"
        m = exchanges[k + 1].metrics
        assert m is not None and m.cached_tokens is not None
        assert m.cached_tokens >= len(before)  # and the engine did reuse it
        pairs += 1
    assert pairs >= 5
    # A trimmed send keeps the system prompt's tokens at the start.
    # framing + the system prompt's own text: the summary is appended after it, inside
    # the one system message, so everything up to the end of the user's text stays
    system_only = local_backend.format_prompt((Message("system", SYSTEM),))[0]
    longer = local_backend.format_prompt((Message("system", SYSTEM + "\n\nmore"),))[0]
    pairs_ = zip(system_only, longer, strict=False)
    n = next(i for i, (a, b) in enumerate(pairs_) if a != b)
    head = system_only[:n]
    assert len(head) > len(local_backend._llm.tokenize(SYSTEM.encode(), add_bos=False))
    for k, e in enumerate(exchanges):
        if e.trimmed:
            assert played.tokens[k][: len(head)] == head


def test_originals_are_kept_and_marked(played: Played) -> None:
    turns, trimmer = played.turns, played.turns.trimmer
    final = {m.id: (m.role, m.content) for m in turns.conversation.messages}
    # Every message keeps the text it had when its turn ended; nothing was removed.
    for snap in played.snapshots:
        for mid, role, content in snap:
            assert final[mid] == (role, content)
    assert [m.content for m in turns.conversation.messages if m.role == "user"] == TURNS
    assert trimmer.covered and trimmer.covered <= set(final)
    summarized = [m for m in turns.conversation.messages if trimmer.is_summarized(m)]
    assert {m.id for m in summarized} == trimmer.covered
    # The summary is its own object, not a message of the conversation.
    assert not any(c.startswith(SUMMARY_HEADER) for _, c in final.values())
    trimmer.enabled = False
    try:  # switched off: the whole history goes out again
        assert turns.request().messages == turns.conversation.prompt_messages()
        assert not trimmer.is_summarized(summarized[0])
    finally:
        trimmer.enabled = True


def test_summary_runs_after_the_answer_and_outside_the_next_ttft(played: Played) -> None:
    turns = played.turns
    exchanges = turns.exchanges
    for summary in turns.trimmer.summaries:
        # The first send after the summary was written is the one that used it ...
        user = next(e for e in exchanges if e.trace.t_sent >= summary.finished_ns)
        assert user.trimmed
        # ... the answer before it had finished before the summary was sent ...
        prev = exchanges[exchanges.index(user) - 1]
        assert prev.trace.t_done is not None and prev.trace.t_done <= summary.started_ns
        assert prev.answer.status == "complete"
        # ... and, the local model being busy with the summary, the send waited for it
        # before its request went out: recorded on the exchange, not hidden in its TTFT.
        assert user.trim_wait_ms is not None and user.trim_note is not None
        assert user.trim_note.startswith("waited")
        assert "one request at a time" in user.trim_note


def test_stats_report_tokens_cut_and_summary_cost(
    played: Played, local_backend: LocalBackend
) -> None:
    turns = played.turns
    stats = turns.trim_stats()
    last = turns.exchanges[-1]
    assert last.request is not None
    # the history as it was at the last send (its answer came after)
    full = local_backend.count_tokens(turns.conversation.prompt_messages()[:-1]).tokens
    sent = local_backend.count_tokens(last.request.messages).tokens
    assert full > sent and last.tokens_cut == stats.tokens_cut == full - sent
    assert stats.tokens_cut_total == sum(e.tokens_cut for e in turns.exchanges)
    assert stats.summaries == len(turns.trimmer.summaries) >= 2
    assert not stats.estimated and stats.budget == BUDGET
    assert stats.prefill_tok_s is not None and stats.prefill_s_saved is not None
    assert stats.prefill_s_saved == pytest.approx(stats.tokens_cut_total / stats.prefill_tok_s)
    assert stats.summary_ttft_ms is not None and stats.summary_e2e_ms is not None
    assert 0 < stats.summary_ttft_ms <= stats.summary_e2e_ms <= stats.summary_ms_total
    assert stats.summary_tokens and stats.summary_tokens <= SUMMARY_TOKENS


class Gated:
    """The real local backend behind a gate the test opens (a summarizer held back)."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        await self.gate.wait()
        async for event in self.inner.stream(request):
            yield event


async def _until_pending(turns: TurnController, texts: list[str]) -> None:
    for text in texts:
        await say(turns, text)
        if turns.trimmer.pending:
            return
    raise AssertionError("no summary was started")


async def test_send_that_fits_does_not_wait_for_the_summary(local_backend: LocalBackend) -> None:
    turns = TurnController(local_backend, Settings(system=SYSTEM, max_tokens=24, temperature=0))
    gated = Gated(local_backend)
    t = turns.trimmer
    t.budget, t.keep_last, t.lookahead, t.summarizer = 400, 1, 4, gated
    t.summary_tokens = SUMMARY_TOKENS
    await _until_pending(turns, TURNS)
    nxt = "Thanks! One more question about bees."
    fits = local_backend.count_tokens((*turns.request().messages, Message("user", nxt)))
    assert fits.tokens <= 400  # precondition: the next send fits without the summary
    e = await say(turns, nxt)  # completes although the summary is still held back
    assert t.pending and e.answer.status == "complete"
    assert e.trim_note == "summary not ready: sent full history" and not e.trimmed
    history = turns.conversation.prompt_messages()[:-1]  # all but the new answer
    assert e.request is not None and e.request.messages == history
    gated.gate.set()
    while t.pending:  # noqa: ASYNC110 - the summary runs on the llama thread
        await asyncio.sleep(0.05)
    e = await say(turns, "And what about the queen?")
    assert e.trimmed and e.request is not None
    assert SUMMARY_HEADER in e.request.messages[0].content  # the summary, in the system message
    await turns.aclose()


async def test_send_over_budget_waits_for_the_summary(local_backend: LocalBackend) -> None:
    turns = TurnController(local_backend, Settings(system=SYSTEM, max_tokens=24, temperature=0))
    gated = Gated(local_backend)
    t = turns.trimmer
    t.budget, t.keep_last, t.lookahead, t.summarizer = 400, 1, 4, gated
    t.summary_tokens = SUMMARY_TOKENS
    await _until_pending(turns, TURNS)
    t.budget = local_backend.count_tokens(turns.request().messages).tokens  # now too small
    send = asyncio.create_task(say(turns, "Tell me about the queen."))
    while turns.exchanges[-1].user.content != "Tell me about the queen.":  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    waiting = turns.exchanges[-1]
    await asyncio.sleep(0.3)
    assert waiting.trace.t_sent == 0 and not send.done()  # held until the summary exists
    gated.gate.set()
    e = await send
    assert e is waiting and e.trimmed and e.answer.status == "complete"
    assert e.trim_wait_ms is not None and e.trim_note is not None
    assert e.trim_note.startswith("waited") and "one request at a time" not in e.trim_note
    assert t.summary is not None and e.trace.t_sent >= t.summary.finished_ns
    await turns.aclose()


class BrokenSummarizer:
    """A summarizer that fails: with an error event, or by raising."""

    name, model = "broken", "none"
    exact_token_counts = serial = shares_cpu = False
    context_window = context_source = None
    state: LoadState = "ready"
    state_detail = "scripted"

    def __init__(self, raises: bool) -> None:
        self.raises = raises
        self.calls = 0

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        return TokenCount(estimate_messages(messages), estimated=True)

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        return None

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        return None  # no tokenizer of its own: the prompt's sections are estimated

    async def warm(self, messages: tuple[Message, ...]) -> int:
        return 0

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.calls += 1
        if self.raises:
            raise RuntimeError("summarizer exploded")
        yield StreamError("server", "summarizer exploded")


@pytest.mark.parametrize("raises", [False, True])
async def test_failing_summarizer_leaves_the_chat_working_untrimmed(
    local_backend: LocalBackend, raises: bool
) -> None:
    turns = TurnController(local_backend, Settings(system=SYSTEM, max_tokens=16, temperature=0))
    broken = BrokenSummarizer(raises)
    turns.trimmer.budget, turns.trimmer.keep_last = 250, 1
    turns.trimmer.summarizer = broken
    for text in TURNS[:7]:
        e = await say(turns, text)
        assert e.answer.status == "complete"
        assert e.request is not None and not e.trimmed
        # the whole history went out: no summary message
        assert not any(SUMMARY_HEADER in m.content for m in e.request.messages)
    assert broken.calls >= 1 and turns.trimmer.summary is None
    notes = [e.trim_note for e in turns.exchanges if e.trim_note]
    assert any("summary failed" in n and "summarizer exploded" in n for n in notes)
    assert "summarizer exploded" in (turns.trim_stats().last_error or "")
    await turns.aclose()


def _script(tmp_path: Path, turns: list[str]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"system": SYSTEM, "turns": turns, "max_tokens": 8}))
    return str(path)


def test_bench_prints_one_json_object_per_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(tmp_path, TURNS[:3])
    assert main(["bench", "--n-ctx", "2048", "--temperature", "0", "--json", script]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    turns, (total,) = lines[:-1], lines[-1:]
    assert [t["turn"] for t in turns] == [1, 2, 3] and all(t["type"] == "turn" for t in turns)
    assert turns[0]["prompt_tokens"] < turns[1]["prompt_tokens"] < turns[2]["prompt_tokens"]
    assert turns[2]["cached_tokens"] >= turns[1]["prompt_tokens"]
    for t in turns:
        assert t["evaluated_prompt_tokens"] == t["prompt_tokens"] - t["cached_tokens"]
        assert not t["trimmed"] and t["error"] is None and 0 < t["output_tokens"] <= 8
    assert total["type"] == "summary" and total["turns"] == 3 and total["errors"] == 0
    assert total["prompt_tokens"] == sum(t["prompt_tokens"] for t in turns)


def test_bench_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path, TURNS[:2])
    assert main(["bench", "--concurrency", "2", script]) == 2
    assert "remote backend" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": []}')
    assert main(["bench", str(bad)]) == 2
    assert "non-empty list" in capsys.readouterr().err


@pytest.mark.server
def test_bench_concurrency_against_a_real_server(
    llama_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(tmp_path, TURNS[:2])
    argv = ["bench", "--backend", "openai", "--base-url", llama_server]
    assert main([*argv, "--concurrency", "2", "--no-trim", "--temperature", "0", script]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [x for x in lines if x.startswith("turn")]
    assert len(rows) == 4 and sum("/1 " in r for r in rows) == 2  # two copies per turn
    assert lines[-1].startswith("total: 4 turns, 0 errors") and "tok/s aggregate" in lines[-1]
