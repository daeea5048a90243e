"""The history trimmer at its edges, without a model: what a send waiting for a summary
says (the wait in ms, a serial engine, a summary dropped or cancelled), what a server's
refusal plans, who writes the summary and what it is asked, a summary that extends an
earlier one, and the panel's figures (issue 49's mutation testing of
chat/trim/trimmer.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from phasechat.backends.base import TokenCount
from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    StreamError,
)
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trim import trimmer as trimmer_module
from phasechat.chat.trim.summarize import SUMMARY_HEADER, Summary
from phasechat.chat.trim.trimmer import Refused, SendPlan, Trimmer, measured_prefill_rate
from phasechat.telemetry.metrics import metrics_from_dict
from tests.test_trim_plan import Window

SYSTEM = "Be brief and kind."


class Words(Window):
    """One token a word, exactly (test_trim_plan's `Window`: its requests and warm-ups
    kept); a summary answered with `said` after `gate`, if set, or cancelled, or failed."""

    def __init__(self, name: str = "words", said: str = "Rosa keeps bees.") -> None:
        super().__init__()
        self._name = name
        self.text = said
        self.asked = self.requests
        self.gate: asyncio.Event | None = None
        self.cancel = False
        self.fail = False

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if self.gate is not None:
            await self.gate.wait()
        if self.cancel:
            raise asyncio.CancelledError
        if self.fail:
            self.requests.append(request)
            yield StreamError("server", "no summaries here")
            return
        if not self.text:
            self.requests.append(request)
            yield Finished("stop")
            return
        async for event in super().stream(request):
            yield event


class Serial(Words):
    serial = True


def chat(n: int = 4, words: int = 20, system: str = SYSTEM) -> Conversation:
    c = Conversation(system)
    for i in range(n):
        c.add(ChatMessage("user", " ".join([f"q{i}"] * words)))
        c.add(ChatMessage("assistant", " ".join([f"a{i}"] * words)))
    return c


class Clock:
    """`time.perf_counter` as the trimmer reads it: 10.0 s, then 10.25 s."""

    def __init__(self) -> None:
        self.reads = iter([10.0, 10.25])

    def perf_counter(self) -> float:
        return next(self.reads)


@pytest.mark.parametrize(
    ("backend", "where"),
    [(Words(), ""), (Serial(), " (the local model runs one request at a time)")],
)
async def test_a_wait_for_the_summary_says_how_long_in_ms_and_why(
    backend: Words, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = chat()
    trimmer = Trimmer(budget=100)
    assert trimmer.start(backend, c, max_tokens=16)
    plan = trimmer.prepare(backend, c, max_tokens=16)  # 168 words: over, one in flight
    assert (plan.wait, plan.serial) == (True, bool(where))
    monkeypatch.setattr(trimmer_module, "time", Clock())
    done = await trimmer.wait(plan)
    assert (done.trimmed, done.waited_ms) == (True, 250.0)
    assert done.note == f"waited 250 ms for the summary{where}"
    # used now: the next send is not "the first with a new summary" again
    monkeypatch.undo()
    assert trimmer.prepare(backend, c, max_tokens=16).trimmed is False


async def test_a_summary_cancelled_under_the_trimmer_is_said_at_the_next_send() -> None:
    backend = Words()
    backend.cancel = True  # its request was cancelled (a closed connection)
    c = chat()
    trimmer = Trimmer(budget=1000)
    assert trimmer.start(backend, c, max_tokens=16)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    plan = trimmer.prepare(backend, c, max_tokens=16)
    assert plan.note == "summary failed: cancelled; sent full history" and not plan.trimmed


async def test_a_new_summary_after_a_failed_one_carries_the_failure_and_the_engines_queue() -> None:
    backend = Serial(said="")
    backend.gate = asyncio.Event()
    c = chat()
    trimmer = Trimmer()  # no budget: the backend's window (8192) less the answer, etc.
    backend.context_window = 200
    assert trimmer.start(backend, c, max_tokens=16)
    trimmer._task.cancel()  # type: ignore[union-attr]  # the first fails
    await asyncio.sleep(0)
    plan = trimmer.prepare(backend, c, max_tokens=16)  # 168 > 200 - 16 - 64: over
    assert plan.wait and plan.serial  # a second one started, on the chat's own engine
    assert plan.note == "summary failed: cancelled; sent full history"
    await trimmer.aclose()


# -- a server's refusal --------------------------------------------------------------------


async def test_a_refusal_plans_a_wait_on_the_engine_and_a_failed_summary_sends_nothing() -> None:
    backend = Serial()
    backend.fail = True
    c = chat()
    trimmer = Trimmer()
    plan = trimmer.tell(Refused(backend, c, 16, 1))  # a window of one token, as named
    assert trimmer.windows == {"words": 1}
    assert plan is not None and plan.wait and plan.serial and plan.ready is not None
    done = await plan.ready()
    assert not done.trimmed and done.messages == ()  # nothing to send again
    assert done.note == "summary failed: no summaries here; sent full history"


async def test_a_refusal_that_names_no_window_keeps_none() -> None:
    backend = Words()
    trimmer = Trimmer()
    for n_ctx in (0, -5, None):
        trimmer.follow(Conversation())
        trimmer.tell(Refused(backend, chat(), 16, n_ctx))
        assert trimmer.windows == {}
        await trimmer.aclose()


def test_a_window_of_one_token_is_a_window() -> None:
    backend = Words()
    backend.context_window = 1
    assert Trimmer().context_for(backend) == 1
    backend.context_window = 0
    assert Trimmer().context_for(backend) == trimmer_module.DEFAULT_CONTEXT


# -- the summary request ---------------------------------------------------------------------


async def test_the_summary_is_written_by_the_summarizer_set_and_asked_as_a_user() -> None:
    backend, summarizer = Words(), Words("summarizer")
    trimmer = Trimmer(budget=100, summarizer=summarizer)
    assert trimmer.summarizer is summarizer
    c = chat()
    assert trimmer.start(backend, c, max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    assert backend.asked == [] and len(summarizer.asked) == 1
    messages = summarizer.asked[0].messages
    assert messages[0] == Message("system", SYSTEM)
    assert messages[-1].role == "user" and messages[-1].content.startswith("Summarize")
    # a second summary extends the first, under the same system prompt
    c.add(ChatMessage("user", " ".join(["q9"] * 40)))
    c.add(ChatMessage("assistant", " ".join(["a9"] * 40)))
    assert trimmer.start(backend, c, max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    head = summarizer.asked[1].messages[0]
    assert head.role == "system" and head.content.startswith(SYSTEM + "\n\n" + SUMMARY_HEADER)


async def test_a_summary_without_a_system_prompt_starts_with_the_turns() -> None:
    backend = Words()
    trimmer = Trimmer(budget=100)
    assert trimmer.start(backend, chat(system=""), max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    assert backend.asked[0].messages[0].role == "user"


async def test_an_unusable_summary_that_extends_an_earlier_one_keeps_its_lines() -> None:
    backend = Words(said="")  # an empty summary: replaced by an extractive one
    trimmer = Trimmer(budget=100, summary_tokens=256)
    c = chat()
    covers = frozenset(m.id for m in c.messages[:2])
    trimmer.summary = Summary("- user: the earlier line.", covers, "w", "m", metrics_from_dict({}))
    assert trimmer.start(backend, c, max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    assert trimmer.summary is not None and trimmer.summary.kind == "extractive"
    assert trimmer.summary.text.startswith("- user: the earlier line.")


def test_no_summary_starts_outside_an_event_loop() -> None:
    assert not Trimmer(budget=10).start(Words(), chat(), max_tokens=16)


async def test_no_summary_starts_after_an_answer_with_nothing_to_summarize() -> None:
    c = Conversation(SYSTEM)
    c.add(ChatMessage("user", " ".join(["q"] * 300)))  # one turn: nothing to summarize
    assert not Trimmer(budget=100).after_answer(Words(), c, max_tokens=16)


# -- what a send counts -----------------------------------------------------------------------


async def test_only_the_send_that_goes_counts_what_the_summary_cut() -> None:
    backend = Words()
    backend.gate = asyncio.Event()
    c = chat()
    trimmer = Trimmer(budget=100)
    assert trimmer.start(backend, c, max_tokens=16)
    plan = trimmer.plan(backend, c, max_tokens=16)
    assert plan.wait and plan.tokens_cut == 0 and trimmer.tokens_cut_total == 0
    backend.gate.set()
    assert plan.ready is not None
    sent = await plan.ready()
    assert sent.tokens_cut > 0 and trimmer.tokens_cut_total == sent.tokens_cut
    full = sum(len(m.content.split()) for m in c.prompt_messages())
    assert sent.tokens_cut == full - sent.prompt_tokens  # type: ignore[operator]
    again = trimmer.plan(backend, c, max_tokens=16)  # no wait: counted at once
    assert again.tokens_cut == sent.tokens_cut
    assert trimmer.tokens_cut_total == 2 * sent.tokens_cut


# -- the panel --------------------------------------------------------------------------------


async def test_the_panel_shows_what_is_pending_failed_and_why_the_model_summary_was_not_used() -> (
    None
):
    backend = Words(said="")
    backend.gate = asyncio.Event()
    trimmer = Trimmer(budget=100)
    fresh = trimmer.stats(backend, 16, [])
    assert (fresh.pending, fresh.last_error, fresh.summary_why) == (False, None, None)
    c = chat()
    assert trimmer.start(backend, c, max_tokens=16)
    assert trimmer.stats(backend, 16, []).pending
    backend.gate.set()
    await trimmer.wait(SendPlan(wait=True))
    stats = trimmer.stats(backend, 16, [])
    assert not stats.pending and stats.summary_why == "the model's summary was empty"
    answers = [metrics_from_dict({"evaluated_prompt_tokens": 400, "ttft_ms": 200.0})]
    rate = measured_prefill_rate(answers)
    assert rate == 2000.0 and trimmer.stats(backend, 16, answers).prefill_tok_s == rate
    failing = Words(said="")
    failing.gate = asyncio.Event()
    trimmer.follow(Conversation())
    trimmer.last_error = "the server said no"
    assert trimmer.stats(failing, 16, []).last_error == "the server said no"


async def test_a_summary_written_in_the_background_is_prefilled_by_default() -> None:
    backend = Words()
    trimmer = Trimmer(budget=200, keep_last=1)
    assert trimmer.prefill is True
    c = chat(n=4, words=20)
    assert trimmer.after_answer(backend, c, max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    await asyncio.sleep(0)
    assert backend.warmed == [trimmer.prompt_messages(c)]


class Framed(Words):
    """One token a word and one a message (its template's framing), for the three roles
    a chat template knows only."""

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        for m in messages:
            if m.role not in ("system", "user", "assistant"):
                raise ValueError(f"no template for role {m.role!r}")
        return TokenCount(sum(len(m.content.split()) + 1 for m in messages), estimated=False)


@pytest.mark.parametrize(
    ("system", "covered"),
    # turns of 20 tokens (9 + 9 words, framed); budget 184: a goal of 92 - 16 - 16 = 60
    # tokens kept. With "S S S" (4 tokens) the last three turns are 64: two turns go; with
    # no system prompt they are 60, exactly the goal: one turn goes
    [("S S S", 4), ("", 2)],
)
async def test_a_trim_counts_the_system_prompt_it_keeps_and_nothing_without_one(
    system: str, covered: int
) -> None:
    backend = Framed()
    trimmer = Trimmer(budget=184, summary_tokens=16)
    c = chat(n=4, words=9, system=system)
    assert trimmer.start(backend, c, max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    assert trimmer.covered == {m.id for m in c.messages[:covered]}


async def test_a_send_over_budget_with_too_few_turns_is_still_the_first_with_a_new_summary() -> (
    None
):
    backend = Words()
    c = chat(n=2)
    c.add(ChatMessage("user", " ".join(["long"] * 300)))  # the new question, too long
    trimmer = Trimmer(budget=100)
    assert trimmer.start(backend, c, max_tokens=16)  # written before the send
    await asyncio.sleep(0)
    plan = trimmer.prepare(backend, c, max_tokens=16)
    assert plan.trimmed and not plan.wait
    assert plan.note is not None and plan.note.startswith("over budget (")


async def test_a_send_waiting_for_a_second_summary_counts_no_cut_until_it_goes() -> None:
    backend = Words()
    c = chat()
    trimmer = Trimmer(budget=100)
    covers = frozenset(m.id for m in c.messages[:2])
    trimmer.summary = Summary("the first turn", covers, "w", "m", metrics_from_dict({}))
    backend.gate = asyncio.Event()
    assert trimmer.start(backend, c, max_tokens=16)  # a second one, in flight
    plan = trimmer.plan(backend, c, max_tokens=16)
    assert plan.wait and plan.tokens_cut == 0
    assert (trimmer.tokens_cut_total, trimmer.last_tokens_cut) == (0, 0)
    backend.gate.set()
    assert plan.ready is not None
    sent = await plan.ready()
    assert trimmer.tokens_cut_total == sent.tokens_cut > 0


async def test_a_first_unusable_summary_is_the_first_sentence_of_each_turn_alone() -> None:
    backend = Words(said="")
    trimmer = Trimmer(budget=100, summary_tokens=256)
    assert trimmer.start(backend, chat(), max_tokens=16)
    await trimmer.wait(SendPlan(wait=True))
    assert trimmer.summary is not None and trimmer.summary.text.startswith("- user: q0 q0")
