"""The turn controller at its edges, without a model: what a refused prompt, a summary
waited for, a template's refusal, a stop at each stage and each subscriber are told
and see, word for word and in order (the slips issue 49's mutation testing found no test
of in chat/turns.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest

from phasechat.backends.base import LoadState, PromptRefused, RenderedPrompt, TokenCount
from phasechat.backends.events import (
    AnswerTokens,
    Event,
    Finished,
    GenerationRequest,
    Message,
    PrefillProgress,
    ReasoningDelta,
    StreamError,
    TextDelta,
)
from phasechat.chat import turns as turns_module
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trim.summarize import Summary
from phasechat.chat.trim.trimmer import measured_prefill_rate
from phasechat.chat.turns import (
    Exchange,
    InputError,
    MessageAdded,
    MessageUpdated,
    RequestEnded,
    RequestSent,
    SaveFailed,
    Streamed,
    TurnController,
    TurnEnded,
    TurnEvent,
    TurnFailed,
)
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.recorder import Trace
from tests.scripted import ScriptedBackend

SUMMARY = "SUMMARY of the early turns."


def words(messages: tuple[Message, ...]) -> int:
    """The desk's own token count: a word a token, and one a message."""
    return sum(len(m.content.split()) + 1 for m in messages)


class Desk(ScriptedBackend):
    """A backend whose count is exact (a word a token), which answers "answer N" to the
    chat and `SUMMARY` to a summary request (temperature 0), refuses a prompt longer
    than `window` as a server does (its n_ctx in the error's detail, as `n_ctx_named`),
    and fails or refuses its template on demand."""

    exact_token_counts = True

    def __init__(self, window: int | None = None) -> None:
        super().__init__(name="desk")
        self.window = window
        self.n_ctx_named: object = window
        self.requests: list[GenerationRequest] = []  # the chat's, not the summaries'
        self.summaries: list[GenerationRequest] = []
        self.fail_summaries = False
        self.fail_next: str | None = None  # an error kind for the next chat request
        self.fail_text = ""  # what it says before that error
        self.refuse_template = False
        self.summary_gate: asyncio.Event | None = None

    @property
    def model(self) -> str:
        return "desk-model"

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        if self.refuse_template:
            raise PromptRefused("Conversation roles must alternate user/assistant")
        return TokenCount(words(messages), estimated=False)

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if request.temperature == 0.0:  # a summary
            self.summaries.append(request)
            if self.summary_gate is not None:
                await self.summary_gate.wait()
            if self.fail_summaries:
                yield StreamError("server", "no summaries here")
                return
            yield TextDelta(SUMMARY)
            yield Finished("stop")
            return
        self.requests.append(request)
        n = words(request.messages)
        if self.fail_next is not None:
            kind, self.fail_next = self.fail_next, None
            if self.fail_text:
                yield TextDelta(self.fail_text)
            yield StreamError(kind, "it broke")  # type: ignore[arg-type]
            return
        if self.window is not None and n > self.window:
            said = f"request ({n} tokens) exceeds the available context size ({self.window})"
            detail: dict[str, object] = {"n_ctx": self.n_ctx_named}
            yield StreamError("context_overflow", said, detail=detail)
            return
        yield TextDelta(f"answer {len(self.requests)}")
        yield Finished("stop")


def long_question(i: int) -> str:
    return f"Turn {i}: " + "many words here " * 13  # 41 words


async def chat(turns: TurnController, n: int) -> None:
    for i in range(n):
        await turns.send(long_question(i))


def requests_of(events: list[TurnEvent]) -> list[tuple[str, object]]:
    return [
        ("sent", e.trace) if isinstance(e, RequestSent) else ("ended", e.trace)
        for e in events
        if isinstance(e, RequestSent | RequestEnded)
    ]


# -- a prompt the server refused as too long -----------------------------------------


async def test_a_refused_prompt_is_trimmed_to_the_window_named_and_sent_once_more() -> None:
    backend = Desk(window=150)
    turns = TurnController(backend, Settings(system="", max_tokens=16))
    await chat(turns, 3)  # 3 x 42 words and the answers: 132 tokens, under 150
    assert [e.answer.status for e in turns.exchanges] == ["complete"] * 3
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    await turns.send(long_question(3))
    e = turns.exchanges[-1]
    assert (e.answer.status, e.answer.content) == ("complete", "answer 5")
    refused, resent = backend.requests[-2:]
    assert words(refused.messages) > 150 >= words(resent.messages)
    # the oldest turns as one summary in the system message, then the last question
    assert [m.role for m in resent.messages] == ["system", "user"]
    assert resent.messages[0].content.endswith(SUMMARY)
    assert resent.messages[1].content == long_question(3)
    assert e.request == resent and e.trimmed
    assert e.anatomy is not None and e.answer.anatomy is e.anatomy  # of the resent prompt
    assert e.trim_note is not None and e.trim_note.startswith("waited ")
    assert turns.trimmer.windows == {"desk": 150}  # learned from the refusal
    # the refused request's trace was ended and replaced by the resent one's
    told = requests_of(heard)
    assert [what for what, _ in told] == ["sent", "ended", "sent", "ended"]
    first, second = told[0][1], told[2][1]
    assert told[1][1] is first and told[3][1] is second is e.trace and first is not second
    sent = [x for x in heard if isinstance(x, RequestSent)]
    assert [x.request for x in sent] == [refused, resent]
    assert all(x.backend is backend for x in sent)
    ended = [x for x in heard if isinstance(x, RequestEnded)]
    assert ended[0].metrics.finish == "error" and ended[1].metrics is e.metrics
    assert e.trace.notices == [
        "the server refused the prompt as longer than its window: request "
        f"({words(refused.messages)} tokens) exceeds the available context size (150); "
        "trimmed the history and sent it again"
    ]
    assert (e.trace.window, e.trace.window_source) == (150, "the server's refusal")
    assert (e.trace.prompt_estimate, e.trace.prompt_estimate_exact) == (
        words(resent.messages),
        True,
    )


@pytest.mark.parametrize("named", ["150", None, 0])
async def test_a_refusal_whose_window_is_not_a_number_is_not_learned(named: object) -> None:
    backend = Desk(window=150)
    backend.n_ctx_named = named
    turns = TurnController(backend, Settings(system="", max_tokens=16))
    await chat(turns, 4)
    assert turns.trimmer.windows == {}
    assert turns.exchanges[-1].answer.status == "complete"  # trimmed all the same


async def test_a_refusal_stands_when_the_summary_fails() -> None:
    backend = Desk(window=150)
    turns = TurnController(backend, Settings(system="", max_tokens=16))
    await chat(turns, 3)
    backend.fail_summaries = True
    asked = len(backend.requests)
    await turns.send(long_question(3))
    e = turns.exchanges[-1]
    assert len(backend.requests) == asked + 1 and backend.summaries  # tried, not resent
    assert (e.answer.status, e.user.status) == ("error", "error")
    assert e.answer.error is not None and e.answer.error.startswith("request (")
    assert e.trace.notices == [] and not e.trimmed


async def test_an_error_other_than_an_overflow_is_not_trimmed_and_sent_again() -> None:
    backend = Desk(window=150)
    turns = TurnController(backend, Settings(system="", max_tokens=16))
    await chat(turns, 3)
    backend.fail_next = "server"
    asked = len(backend.requests)
    await turns.send("one more")
    e = turns.exchanges[-1]
    assert len(backend.requests) == asked + 1 and not backend.summaries
    assert (e.answer.status, e.answer.error) == ("error", "it broke")
    assert turns.trimmer.windows == {}


# -- a send that waits for the summary ------------------------------------------------


async def test_a_send_behind_a_summary_waits_for_it_and_sends_the_trimmed_prompt() -> None:
    backend = Desk()
    backend.summary_gate = gate = asyncio.Event()
    turns = TurnController(backend, Settings(system="Be brief.", max_tokens=16))
    turns.set_trim(True, budget=120, keep_last=1)
    await chat(turns, 2)  # 88 tokens: the next turn will not fit, a summary starts
    assert turns.trimmer.pending
    turn = turns.send(long_question(2))  # 132 tokens > 120, the summary not written
    e = turn.exchange
    assert e.trim_plan is not None and e.trim_plan.wait and e.tokens_cut == 0
    await asyncio.sleep(0)
    assert not backend.requests[2:]  # waits, unsent
    gate.set()
    await turn
    sent = backend.requests[-1]
    assert e.request == sent and sent.messages[0].content.startswith("Be brief.\n\n")
    assert sent.messages[0].content.endswith(SUMMARY)
    assert sent.messages[-1] == Message("user", long_question(2))
    assert e.trimmed and e.trim_note is not None and e.trim_note.startswith("waited ")
    assert e.trim_wait_ms is not None and e.trim_wait_ms > 0
    assert e.trim_plan is not None and e.trim_plan.trimmed and not e.trim_plan.wait
    assert (e.trace.prompt_estimate, e.trace.prompt_estimate_exact) == (words(sent.messages), True)
    assert e.trace.t_queued is not None and 0 < e.trace.t_queued <= e.trace.t_sent
    asked = turns.conversation.messages[:-1]  # the answer is not in its own prompt
    full = words((Message("system", "Be brief."), *(m.as_message() for m in asked)))
    assert e.tokens_cut == full - words(sent.messages) == turns.trimmer.last_tokens_cut > 0


async def test_a_turn_stopped_while_it_waits_for_the_summary_ends_cancelled() -> None:
    backend = Desk()
    backend.summary_gate = asyncio.Event()  # never written
    turns = TurnController(backend, Settings(system="", max_tokens=16))
    turns.set_trim(True, budget=120, keep_last=1)
    await chat(turns, 2)
    turn = turns.send(long_question(2))
    await asyncio.sleep(0)
    assert turns.stop()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert turn.exchange.answer.status == "cancelled" and not turns.busy
    assert len(backend.requests) == 2  # never sent
    await turns.aclose()


# -- what a template refuses, what a user types ------------------------------------------


async def test_a_prompt_the_template_refuses_is_kept_marked_and_can_be_sent_again() -> None:
    backend = Desk()
    turns = TurnController(backend, Settings(system="s"))
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    backend.refuse_template = True
    with pytest.raises(InputError) as refused:
        turns.begin("q1")
    assert str(refused.value) == "Conversation roles must alternate user/assistant"
    (user,) = turns.conversation.messages
    assert (user.content, user.status, user.error) == (
        "q1",
        "error",
        "Conversation roles must alternate user/assistant",
    )
    assert heard == [MessageAdded(user), MessageUpdated(user, final=True)]
    assert not turns.busy and not turns.exchanges
    # the template relents: Ctrl+R sends the kept question again, marked sendable first
    backend.refuse_template = False
    heard.clear()
    e = turns.retry()
    assert e.user is user and (user.status, user.error) == ("complete", None)
    assert heard[:2] == [MessageUpdated(user, final=True), MessageAdded(e.answer)]
    await turns.run(e)
    assert backend.requests[-1].messages[-1] == Message("user", "q1")


async def test_each_refusal_says_why_in_its_own_words() -> None:
    turns = TurnController(Desk(), Settings(system="s"))
    with pytest.raises(InputError) as nothing:
        turns.retry()
    assert str(nothing.value) == "nothing to retry: send a message first"
    for text, why in [
        ("  \n", "empty prompt: type a message first"),
        ("\udcff", "the prompt is not valid UTF-8: not sent"),
    ]:
        with pytest.raises(InputError) as bad:
            turns.begin(text)
        assert str(bad.value) == why
    with pytest.raises(InputError) as bad_system:
        turns.edit_system("\udcff")
    assert str(bad_system.value) == "the system prompt is not valid UTF-8: not changed"
    await turns.send("q1")
    answer = turns.conversation.messages[-1]
    with pytest.raises(InputError) as not_a_question:
        turns.edit(answer.id, "no")
    assert str(not_a_question.value) == "only a question on the branch shown can be edited"
    first = turns.backend
    turns.begin("q2")
    with pytest.raises(InputError) as busy:
        turns.switch_backend(Desk())
    assert str(busy.value) == "still answering: stop the answer first"
    assert turns.backend is first


async def test_a_fresh_controller_stops_a_turn_begun_and_never_run() -> None:
    turns = TurnController(Desk())
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    e = turns.begin("q")
    assert turns.stop()
    assert e.answer.status == "cancelled" and e.metrics is not None
    finals = [x.message for x in heard if isinstance(x, MessageUpdated) and x.final]
    assert finals == [e.answer]
    ended = [x for x in heard if isinstance(x, RequestEnded)]
    assert [(x.trace, x.metrics) for x in ended] == [(e.trace, e.metrics)]
    turns.abandon(e)  # already finished: nothing more is written
    assert [x for x in heard if isinstance(x, MessageUpdated)] == [MessageUpdated(e.answer, True)]


async def test_an_exchange_abandoned_before_it_ran_is_finished_as_cancelled() -> None:
    turns = TurnController(Desk())
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    e = turns.begin("q")
    turns.abandon(e)
    assert (e.answer.status, not turns.busy) == ("cancelled", True)
    assert e.metrics is not None and e.metrics.finish == "cancelled"
    assert [x for x in heard if isinstance(x, MessageUpdated)] == [MessageUpdated(e.answer, True)]


# -- retry, edit, system prompts ---------------------------------------------------------


async def test_retry_answers_the_last_question_even_when_it_has_no_answer() -> None:
    backend = Desk()
    turns = TurnController(backend, Settings(system="s"))
    turns.replace_conversation(
        Conversation("s", [ChatMessage("user", "q1"), ChatMessage("assistant", "a1")])
    )
    turns.conversation.add(ChatMessage("user", "q2"))  # left unanswered
    await turns.run(turns.retry())
    assert [m.content for m in backend.requests[-1].messages] == ["s", "q1", "a1", "q2"]
    assert [m.content for m in turns.conversation.messages] == ["q1", "a1", "q2", "answer 1"]


async def test_a_new_system_prompt_by_edit_copies_only_what_comes_before_the_question() -> None:
    backend = Desk()
    turns = TurnController(backend, Settings(system="old"))
    await chat(turns, 3)
    q2 = turns.conversation.messages[2]
    turns.update_settings(system="new")
    await turns.run(turns.edit(q2.id, "q2b"))
    assert [m.content for m in turns.conversation.messages] == [
        long_question(0),
        "answer 1",
        "q2b",
        "answer 4",
    ]
    assert turns.conversation.system == "new"


async def test_edit_system_answers_again_only_when_it_changed_and_there_is_a_question() -> None:
    backend = Desk()
    turns = TurnController(backend, Settings(system="s"))
    turns.replace_conversation(Conversation("s", [ChatMessage("user", "q")]))
    assert turns.edit_system("s") is None  # unchanged: nothing to answer again
    assert len(turns.conversation.children(None)) == 1
    e = turns.edit_system("t")
    assert e is not None and e.user.content == "q" and turns.conversation.system == "t"
    await turns.run(e)
    assert backend.requests[-1].messages == (Message("system", "t"), Message("user", "q"))


async def test_a_chat_opened_takes_its_system_prompt_and_drops_another_chats_summary() -> None:
    turns = TurnController(Desk(), Settings(system="mine"))
    await chat(turns, 3)
    covers = frozenset(m.id for m in turns.conversation.messages[:2])
    turns.trimmer.summary = Summary("old", covers, "s", "m", metrics_from_dict({}))
    turns.replace_conversation(Conversation("theirs", [ChatMessage("user", "q")]))
    assert turns.settings.system == "theirs" and turns.trimmer.summary is None


async def test_a_sibling_shown_drops_a_summary_of_the_branch_left() -> None:
    turns = TurnController(Desk(), Settings(system="s"))
    await chat(turns, 2)
    q1 = turns.conversation.messages[0]
    await turns.run(turns.edit(q1.id, "q1b"))
    covers = frozenset(m.id for m in turns.conversation.messages)
    turns.trimmer.summary = Summary("of q1b", covers, "s", "m", metrics_from_dict({}))
    turns.show_sibling(turns.conversation.messages[0].id, -1)
    assert turns.trimmer.summary is None


# -- preview: what a send would be --------------------------------------------------------


async def three(system: str = "S") -> tuple[TurnController, list[ChatMessage]]:
    turns = TurnController(Desk(), Settings(system=system))
    for q in ("q1", "q2", "q3"):
        await turns.send(q)
    return turns, turns.conversation.messages


def contents(messages: tuple[Message, ...]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


async def test_preview_of_a_new_system_prompt_answers_the_last_question_again() -> None:
    turns, path = await three()
    root = turns.conversation.root.id
    assert contents(turns.preview("T", edit=root)) == [
        ("system", "T"),
        ("user", "q1"),
        ("assistant", "answer 1"),
        ("user", "q2"),
        ("assistant", "answer 2"),
        ("user", "q3"),
    ]
    assert contents(turns.preview("q4"))[-3:] == [
        ("user", "q3"),
        ("assistant", "answer 3"),
        ("user", "q4"),
    ]
    assert contents(turns.preview("q2b", edit=path[2].id))[-1] == ("user", "q2b")


async def test_preview_of_a_system_prompt_with_no_question_is_the_system_prompt_alone() -> None:
    turns = TurnController(Desk(), Settings(system="S"))
    turns.replace_conversation(
        Conversation("S", [ChatMessage("assistant", "hello"), ChatMessage("assistant", "again")])
    )
    assert contents(turns.preview("T", edit=turns.conversation.root.id)) == [("system", "T")]


async def test_preview_keeps_a_summary_only_where_it_stands_for_the_messages_kept() -> None:
    turns, path = await three()
    covers = frozenset(m.id for m in path[:2])
    turns.trimmer.summary = Summary("q1 and its answer", covers, "s", "m", metrics_from_dict({}))
    head = ("system", "S\n\n" + turns.trimmer.summary.system("S").content.split("\n\n", 1)[1])
    assert contents(turns.preview("q4")) == [
        head,
        ("user", "q2"),
        ("assistant", "answer 2"),
        ("user", "q3"),
        ("assistant", "answer 3"),
        ("user", "q4"),
    ]
    # an edit of q2: the messages kept are exactly those it covers, so it still stands
    assert contents(turns.preview("q2b", edit=path[2].id)) == [head, ("user", "q2b")]
    # an edit of q1: it stands for a message not kept
    assert contents(turns.preview("q1b", edit=path[0].id)) == [("system", "S"), ("user", "q1b")]
    # another system prompt: the summary followed the old one
    assert contents(turns.preview("T", edit=turns.conversation.root.id))[:2] == [
        ("system", "T"),
        ("user", "q1"),
    ]


async def test_preview_without_a_system_prompt_sends_none() -> None:
    turns, _ = await three(system="")
    assert contents(turns.preview("q4"))[0] == ("user", "q1")


# -- ask_over: a side trip's messages as given -------------------------------------------


async def test_ask_over_sends_the_messages_as_given_and_keeps_their_tokens() -> None:
    backend = Desk()
    turns = TurnController(backend, Settings(system="ignored"), trim=False)
    tokens = AnswerTokens((1, 2), (b"a", b"1"), "v")
    given = (
        Message("system", "S"),
        Message("user", "q1"),
        Message("assistant", "a1", tokens=tokens),
        Message("user", "q2"),
    )
    await turns.run(turns.ask_over(given))
    assert backend.requests[-1].messages == given
    assert backend.requests[-1].messages[2].tokens is tokens
    assert turns.conversation.system == "S" and turns.settings.system == "S"
    await turns.run(turns.ask_over((Message("user", "q1"),)))
    assert contents(backend.requests[-1].messages) == [("user", "q1")]
    assert turns.conversation.system == ""


# -- settings, stats, reports ----------------------------------------------------------------


async def test_set_trim_and_the_panels_trim_figures() -> None:
    summarizer = Desk()
    turns = TurnController(Desk())
    turns.set_trim(True, budget=1234, keep_last=2, summarizer=summarizer)
    t = turns.trimmer
    assert (t.enabled, t.budget, t.keep_last, t.summarizer) == (True, 1234, 2, summarizer)
    await turns.send("q")
    stats = turns.trim_stats()
    assert (stats.enabled, stats.budget) == (True, 1234)
    rate = measured_prefill_rate([e.metrics for e in turns.exchanges])
    assert stats.prefill_tok_s == rate
    turns.set_trim(False)
    assert turns.trimmer.keep_last == 4
    assert (turns.trim_stats().enabled, turns.trimmer.budget, turns.trimmer.summarizer) == (
        False,
        None,
        None,
    )
    # no budget: the window less the answer, the margin (and nothing for exact counts)
    turns.update_settings(max_tokens=100)
    assert turns.trim_stats().budget == 8192 - 100 - 64


async def test_a_report_of_saving_reaches_every_subscriber() -> None:
    turns = TurnController(Desk())
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    turns.report(SaveFailed("disk full"))
    assert heard == [SaveFailed("disk full")]


async def test_a_backend_switched_answers_the_next_turn() -> None:
    first, second = Desk(), Desk()
    turns = TurnController(first)
    await turns.send("q1")
    turns.switch_backend(second)
    await turns.send("q2")
    assert (len(first.requests), len(second.requests)) == (1, 1)
    assert turns.backend is second


async def test_answers_are_labelled_with_the_name_given() -> None:
    turns = TurnController(Desk(), name="desk(threads=1)")
    await turns.send("q")
    assert turns.exchanges[0].trace.backend == "desk(threads=1)"
    assert turns.exchanges[0].answer.backend == "desk"


# -- the exchange as the UI reads it -------------------------------------------------------


class Thinks(Desk):
    """Thinks, reports its prefill's progress, then answers with its token ids."""

    tokens = AnswerTokens((7, 8), (b"ok", b"!"), "v")

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests.append(request)
        await asyncio.sleep(0)  # the rendering is asked beside the request
        yield PrefillProgress(total=40, cached=0, processed=5, time_ms=2.0)
        yield PrefillProgress(total=40, cached=0, processed=16, time_ms=4.0)
        yield ReasoningDelta("hmm", tokens=1)
        yield TextDelta("ok!", tokens=2)
        yield self.tokens
        yield Finished("stop")

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        text = "[S]" + messages[0].content + "[U]" + messages[1].content + "[A]"
        return RenderedPrompt(text, tuple(c.encode() for c in text), "tokenizer")


async def test_the_exchange_shows_its_section_live_figures_and_final_record() -> None:
    backend = Thinks()
    turns = TurnController(backend, Settings(system="Be brief."))
    seen: list[tuple[str, float, str]] = []

    def watch(event: TurnEvent) -> None:
        if isinstance(event, Streamed) and isinstance(event.event, PrefillProgress):
            e = event.exchange
            live = e.live(e.trace.t_sent + 7_000_000)
            seen.append((e.prefill_section(), live.elapsed_ms, live.phase))

    turn = turns.send("a question")
    assert turn.exchange.prefill_section() == ""  # nothing read yet
    turn.subscribe(watch)
    await turn
    assert seen == [("system prompt", 7.0, "prefill"), ("new message 1", 7.0, "prefill")]
    e = turn.exchange
    assert (e.text, e.reasoning, e.kv) == ("ok!", "hmm", None)
    assert (e.answer.content, e.answer.reasoning) == ("ok!", "hmm")
    assert e.answer.tokens == backend.tokens and e.answer.model == "desk-model"
    assert e.metrics is not None
    final = e.live()
    assert (final.phase, final.tokens, final.ttft_ms) == ("done", 3, e.metrics.ttft_ms)
    record = e.export_record(4)
    assert (record["request"], record["prompt"]) == (4, "a question")
    assert record["token_times_ms"] == [round(t / 1e6, 3) for t in e.trace.times]
    assert record["ttft_ms"] == e.metrics.ttft_ms and "token_times_stride" not in record
    assert e.token_times_ms() == [t / 1e6 for t in e.trace.times] and len(e.trace.times) == 2
    assert e.anatomy is not None and e.answer.anatomy is e.anatomy
    assert turns.held("desk") is not None


async def test_an_exchange_reads_its_live_figures_on_the_clock_while_it_streams() -> None:
    turns = TurnController(Desk())
    before: list[float] = []

    def watch(event: TurnEvent) -> None:
        if isinstance(event, Streamed) and isinstance(event.event, TextDelta):
            e = event.exchange
            live = e.live()
            assert live.phase == "decode"
            before.append(live.elapsed_ms)

    turns.subscribe(watch)
    await turns.send("q")
    assert len(before) == 1 and before[0] > 0


def test_no_section_without_a_request() -> None:
    trace = Trace(backend="b", model="m", max_tokens=1)
    trace.observe(PrefillProgress(total=4, cached=0, processed=1, time_ms=1.0), 1)
    e = Exchange(ChatMessage("user", "q"), ChatMessage("assistant", ""), trace)
    assert e.prefill_section() == ""


# -- streaming: flushes, the loop's share, the events' order ----------------------------------


class Stamped(Desk):
    """Tokens stamped with the times given (ns after the stream starts: `at`)."""

    def __init__(self, at: list[int]) -> None:
        super().__init__()
        self.at = at

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests.append(request)
        start = time.perf_counter_ns()
        yield ReasoningDelta("why ", t_ns=start)
        for i, offset in enumerate(self.at):
            yield TextDelta(f"t{i} ", t_ns=start + offset)
        yield Finished("stop", t_ns=start + self.at[-1])


async def test_streamed_text_is_handed_on_every_flush_period_from_the_last_flush() -> None:
    flush = int(turns_module.FLUSH_S * 1e9)
    late = flush + 1_000_000_000  # past the first flush, however slow the start
    backend = Stamped([0, late, late + flush - 1, late + flush, late + 2 * flush - 1])
    turns = TurnController(backend)
    flushed: list[tuple[str, str | None, bool]] = []

    def watch(event: TurnEvent) -> None:
        if isinstance(event, MessageUpdated) and event.message.role == "assistant":
            flushed.append((event.message.content, event.message.reasoning, event.final))

    turns.subscribe(watch)
    await turns.send("q")
    assert flushed == [
        ("t0 t1 ", "why ", False),
        ("t0 t1 t2 t3 ", "why ", False),
        ("t0 t1 t2 t3 t4 ", "why ", True),
    ]


async def test_a_burst_stream_gives_the_loop_a_turn_every_few_milliseconds() -> None:
    n = 3000
    turns = TurnController(ScriptedBackend(text=" ".join(["w"] * n)))
    ticks = 0
    streaming = True

    async def ticker() -> None:
        nonlocal ticks
        while streaming:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ticks = 0
    await turns.send("go")
    streaming = False
    await task
    # one turn every YIELD_EVERY_NS of streaming, not one per token (nor none)
    assert 1 <= ticks <= n // 8


async def test_subscribers_hear_in_their_order_and_each_event_names_its_exchange() -> None:
    turns = TurnController(ScriptedBackend(text="a b"))
    order: list[str] = []
    turns.subscribe(lambda e: order.append("controller") if isinstance(e, TurnEnded) else None)
    turn = turns.send("go")
    turn.subscribe(lambda e: order.append("first") if isinstance(e, TurnEnded) else None)
    turn.subscribe(lambda e: order.append("second") if isinstance(e, TurnEnded) else None)
    own: list[TurnEvent] = []
    turn.subscribe(own.append)
    await turn
    assert order == ["first", "second", "controller"]
    assert all(e.exchange is turn.exchange for e in own if isinstance(e, Streamed | TurnEnded))


async def test_a_failed_turn_names_its_exchange() -> None:
    backend = Desk()
    backend.fail_next = "server"
    turns = TurnController(backend)
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    turn = turns.send("q")
    await turn
    failed = [e for e in heard if isinstance(e, TurnFailed)]
    assert [(f.exchange, f.error) for f in failed] == [(turn.exchange, "it broke")]
    # a question with no answer is marked too, in its final write
    finals = [e.message for e in heard if isinstance(e, MessageUpdated) and e.final]
    assert finals[0] is turn.exchange.user and turn.exchange.user.status == "error"


async def test_iterating_a_turn_gives_its_stream_and_leaving_early_stops_it() -> None:
    turns = TurnController(ScriptedBackend(text="one two"))
    events = [type(e).__name__ for e in [x async for x in turns.send("go")]]
    assert events == ["TextDelta", "TextDelta", "Finished"]
    backend = Stalls()
    turns = TurnController(backend)
    turn = turns.send("go")
    events_of = cast(AsyncGenerator[Event, None], aiter(turn))  # a generator, as it says
    async with contextlib.aclosing(events_of) as stream:
        async for _ in stream:
            break
    assert turn.done and turn.exchange.answer.status == "cancelled"
    assert turn.exchange.answer.content == "partial"


class Stalls(Desk):
    """Says "partial", then stalls until stopped."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests.append(request)
        yield TextDelta("partial")
        await asyncio.sleep(60)
        yield Finished("stop")


async def test_aclose_stops_a_turn_and_returns_once_its_answer_is_final() -> None:
    turns = TurnController(Stalls())
    turn = turns.send("go")
    async for _ in turn:
        break
    await turn.aclose()
    assert turn.done and turn.exchange.answer.status == "cancelled"
    assert turn.exchange.metrics is not None


# -- stopping and the prompt's rendering ------------------------------------------------------


class SlowRender(Stalls):
    """A rendering that takes longer than any test: it ends only when cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.render_cancelled = False

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.render_cancelled = True
            raise
        return None


async def test_a_stopped_turn_cancels_its_rendering_and_forgets_what_the_engine_held() -> None:
    backend = SlowRender()
    turns = TurnController(backend)
    turns.trimmer.enabled = False
    turns.switch_backend(Thinks())
    await turns.send("q1")
    assert turns.held("desk") is not None  # a complete answer: what the engine holds
    turns.switch_backend(backend)
    turn = turns.send("go")
    async for _ in turn:
        break
    assert turns.stop()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn.wait(), 30)  # a hang only reaches this
    assert backend.render_cancelled
    assert turns.held("desk") is None  # stopped: not known any more
    assert turn.exchange.answer.status == "cancelled"


class Loads(Thinks):
    """Loading until its first request has started; a prompt rendered only once loaded."""

    def __init__(self) -> None:
        super().__init__()
        self._state: LoadState = "loading"
        self.renders = 0

    @property
    def state(self) -> LoadState:
        return self._state

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        self.renders += 1
        if self._state != "ready":
            return None
        return await super().render(messages)

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        await asyncio.sleep(0)  # loading: the rendering is asked meanwhile
        await asyncio.sleep(0)
        self._state = "ready"
        async for event in super().stream(request):
            yield event


async def test_a_prompt_asked_of_a_loading_backend_is_rendered_again_once_it_is_ready() -> None:
    backend = Loads()
    turns = TurnController(backend, Settings(system="Be brief."))
    await turns.send("a question")
    e = turns.exchanges[0]
    assert backend.renders == 2
    assert e.rendered is not None and e.rendered.text.startswith("[S]Be brief.[U]")


async def test_a_ready_backend_is_asked_for_its_rendering_once() -> None:
    backend = Thinks()
    turns = TurnController(backend, Settings(system="Be brief."))
    calls = 0
    render = backend.render

    async def counted(messages: tuple[Message, ...]) -> RenderedPrompt | None:
        nonlocal calls
        calls += 1
        return await render(messages)

    backend.render = counted  # type: ignore[method-assign]
    await turns.send("a question")
    assert calls == 1
    e = turns.exchanges[0]
    assert e.request is not None and e.rendered == await render(e.request.messages)


# -- after an answer: the summary starts only after one that did not fail ---------------------


async def test_a_summary_starts_after_an_answer_but_not_after_a_failure() -> None:
    backend = Desk()
    turns = TurnController(backend, Settings(system="", max_tokens=16))
    turns.set_trim(True, budget=120, keep_last=1)
    await turns.send(long_question(0))
    backend.fail_next, backend.fail_text = "server", "half an answer"
    await turns.send(long_question(1))  # over the lookahead, but it failed
    assert turns.exchanges[-1].user.status == "complete"  # sent again: it counts
    assert not turns.trimmer.pending and not backend.summaries
    await turns.send(long_question(2))
    assert len(backend.summaries) == 1
    await turns.aclose()


async def test_the_answer_added_names_its_backend_and_model_as_it_starts() -> None:
    turns = TurnController(Desk())
    added: list[tuple[str, str | None, str | None]] = []

    def watch(event: TurnEvent) -> None:
        if isinstance(event, MessageAdded) and event.message.role == "assistant":
            m = event.message
            added.append((m.status, m.backend, m.model))

    turns.subscribe(watch)
    await turns.send("q")
    assert added == [("streaming", "desk", "desk-model")]


async def test_the_final_live_figures_are_the_answers_own() -> None:
    turns = TurnController(ScriptedBackend(text="a b c"))  # tokens not counted: estimated
    await turns.send("q")
    e = turns.exchanges[0]
    assert e.metrics is not None and e.metrics.output_tokens_estimated
    final = e.live()
    assert (final.tokens, final.tokens_estimated) == (e.metrics.output_tokens, True)


class Renders(Desk):
    """Renders any prompt (its contents joined), and says what it was asked to render."""

    def __init__(self, loading: bool = False) -> None:
        super().__init__()
        self.asked: list[tuple[Message, ...]] = []
        self._state: LoadState = "loading" if loading else "ready"

    @property
    def state(self) -> LoadState:
        return self._state

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        self.asked.append(messages)
        text = "|".join(m.content for m in messages)
        return RenderedPrompt(text, tuple(c.encode() for c in text), "tokenizer")

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        await asyncio.sleep(0)  # the rendering is asked meanwhile
        self._state = "ready"
        async for event in super().stream(request):
            yield event


async def test_a_prompt_rendered_while_loading_or_ready_is_asked_once() -> None:
    for loading in (False, True):
        backend = Renders(loading=loading)
        turns = TurnController(backend, Settings(system="S"))
        await turns.send("q")
        assert len(backend.asked) == 1, loading
        assert turns.exchanges[0].rendered is not None


async def test_a_backend_that_cannot_render_is_asked_once_when_ready() -> None:
    backend = Desk()
    asked = 0

    async def render(messages: tuple[Message, ...]) -> RenderedPrompt | None:
        nonlocal asked
        asked += 1
        return None

    backend.render = render  # type: ignore[method-assign]
    turns = TurnController(backend)
    await turns.send("q")
    assert asked == 1 and turns.exchanges[0].rendered is None


async def test_a_chat_opened_asks_the_engine_that_wrote_its_last_answer_what_it_holds() -> None:
    backend = Renders()
    turns = TurnController(backend, Settings(system="S"))
    opened = Conversation(
        "S",
        [
            ChatMessage("user", "q1"),
            ChatMessage("assistant", "a1", "other"),
            ChatMessage("user", "q2"),
            ChatMessage("assistant", "a2", "desk"),
        ],
    )
    turns.replace_conversation(opened)
    await turns.send("q3")
    last = (
        Message("system", "S"),
        Message("user", "q1"),
        Message("assistant", "a1"),
        Message("user", "q2"),
    )
    assert last in backend.asked  # the request a2 answered, rendered to be confirmed
    asked = len(backend.asked)
    await turns.send("q4")  # once only: the engine holds this controller's request now
    assert last not in backend.asked[asked:]


class SlowAnatomy(Desk):
    """Its first prompt's rendering waits for `gate`; its second request stalls."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.streaming = asyncio.Event()

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        if not self.gate.is_set():
            await self.gate.wait()
        return None

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if not self.requests:
            async for event in super().stream(request):
                yield event
            return
        self.requests.append(request)
        yield TextDelta("partial")
        self.streaming.set()
        await asyncio.sleep(60)
        yield Finished("stop")


async def test_a_turn_sent_while_the_last_one_saves_its_anatomy_can_be_stopped() -> None:
    backend = SlowAnatomy()
    turns = TurnController(backend)
    answered = asyncio.Event()
    turns.subscribe(lambda e: answered.set() if isinstance(e, RequestEnded) else None)
    first = turns.send("q1")
    await answered.wait()  # answered; its anatomy still to come
    assert not turns.busy and not first.done
    second = turns.send("q2")
    await backend.streaming.wait()
    backend.gate.set()
    await first  # the first turn's end must not forget the second one
    assert turns.stop()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(second.wait(), 30)  # only a hang reaches this
    assert second.exchange.answer.status == "cancelled"
