"""The turn controller and the conversation tree, without a model: what each turn adds,
where it branches, what the next request holds, and what listeners are told."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    StreamError,
    TextDelta,
)
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trim.summarize import Summary
from phasechat.chat.turns import (
    ConversationWatcher,
    InputError,
    Streamed,
    TurnController,
    TurnEnded,
    TurnEvent,
    TurnFailed,
)
from phasechat.telemetry.metrics import metrics_from_dict
from tests.helpers import answer, ask
from tests.scripted import ScriptedBackend


class Numbered(ScriptedBackend):
    """Answers "answer 1", "answer 2", ... and keeps every request it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[GenerationRequest] = []

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests.append(request)
        yield TextDelta(f"answer {len(self.requests)}")
        yield Finished("stop")


class Heard(ConversationWatcher):
    """A subscriber that writes down what it was told of the conversation."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def message_added(self, message: ChatMessage) -> None:
        self.said.append(("added", message.content))

    def message_updated(self, message: ChatMessage, final: bool) -> None:
        if final:
            self.said.append(("final", message.content))

    def branch_shown(self, conversation: Conversation) -> None:
        self.said.append(("shown", conversation.messages[-1].content))


def texts(turns: TurnController) -> list[str]:
    return [m.content for m in turns.conversation.messages]


def sent(backend: Numbered, index: int = -1) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in backend.requests[index].messages]


async def three_turns(system: str = "Be brief.") -> tuple[TurnController, Numbered]:
    backend = Numbered()
    turns = TurnController(backend, Settings(system=system))
    for q in ("q1", "q2", "q3"):
        await ask(turns, q)
    return turns, backend


# -- the tree ---------------------------------------------------------------------------


def test_a_conversation_is_a_tree_whose_leaf_picks_the_branch_shown() -> None:
    c = Conversation("sys")
    q1 = c.add(ChatMessage("user", "q1"))
    a1 = c.add(ChatMessage("assistant", "a1"))
    c.rewind(q1.id)
    a1b = c.add(ChatMessage("assistant", "a1b"))
    assert [m.content for m in c.messages] == ["q1", "a1b"] and c.system == "sys"
    assert c.siblings(a1) == [a1, a1b]
    assert (c.branch_of(a1), c.branch_of(a1b), c.branch_of(q1)) == ((1, 2), (2, 2), (1, 1))
    q2 = c.add(ChatMessage("user", "q2 under a1b"))
    c.select(a1.id)  # the older sibling: its own branch, to its end
    assert [m.content for m in c.messages] == ["q1", "a1"]
    c.select(a1b.id)  # back: the way down it had is remembered
    assert c.leaf == q2.id
    assert [m.content for m in c.every()] == ["sys", "q1", "a1", "a1b", "q2 under a1b"]
    assert c.questions() == [q1, q2]


def test_a_tree_loaded_from_rows_shows_the_leaf_it_was_given() -> None:
    root = ChatMessage("system", "s")
    q = ChatMessage("user", "q", parent=root.id)
    a, b = ChatMessage("assistant", "a", parent=q.id), ChatMessage("assistant", "b", parent=q.id)
    c = Conversation.from_tree([root, q, a, b], leaf=a.id)
    assert [m.content for m in c.messages] == ["q", "a"]
    assert Conversation.from_tree([root, q, a, b], leaf=None).leaf == b.id  # the newest
    assert Conversation.from_tree([root, q, a, b], leaf=12345).leaf == b.id  # unknown id


def test_a_question_left_unanswered_is_not_sent_again() -> None:
    # stopped before any text (complete, not an error), then failed with no text: neither
    # question is sent again, so no two user messages stand in a row
    c = Conversation("sys")
    c.add(ChatMessage("user", "q0"))
    c.add(ChatMessage("assistant", "a0"))
    c.add(ChatMessage("user", "q1"))
    c.add(ChatMessage("assistant", "", status="cancelled"))
    c.add(ChatMessage("user", "q2"))
    c.add(ChatMessage("assistant", "", status="error", error="connection lost"))
    c.add(ChatMessage("user", "q3"))
    assert c.prompt_messages() == (
        Message("system", "sys"),
        Message("user", "q0"),
        Message("assistant", "a0"),
        Message("user", "q3"),
    )


def test_an_answer_whose_question_is_not_sent_is_not_sent_either() -> None:
    # the first and third questions were refused (too long for the context); their
    # answers kept some text: sent, they would follow the system prompt or another answer
    c = Conversation("sys")
    c.add(ChatMessage("user", "q0", status="error"))
    c.add(ChatMessage("assistant", "a0 partial", status="error"))
    c.add(ChatMessage("user", "q1"))
    c.add(ChatMessage("assistant", "a1"))
    c.add(ChatMessage("user", "q2", status="error"))
    c.add(ChatMessage("assistant", "a2 partial", status="error"))
    c.add(ChatMessage("user", "q3"))
    assert [m.content for m in c.prompt_messages()] == ["sys", "q1", "a1", "q3"]


# -- turns ------------------------------------------------------------------------------


async def test_retry_keeps_the_old_answer_as_a_sibling_and_does_not_send_it() -> None:
    turns, backend = await three_turns()
    old = turns.conversation.messages[-1]
    exchange = turns.retry()
    await answer(turns, exchange)
    assert texts(turns) == ["q1", "answer 1", "q2", "answer 2", "q3", "answer 4"]
    assert turns.conversation.siblings(exchange.answer) == [old, exchange.answer]
    assert turns.conversation.branch_of(exchange.answer) == (2, 2)
    assert old.content == "answer 3" and old.status == "complete"  # intact, with metrics
    assert old.metrics is not None
    # the retry asked the same question over the same history, without the old answer
    assert sent(backend) == sent(backend, 2)


async def test_editing_question_2_of_3_branches_there_and_keeps_the_old_branch() -> None:
    turns, backend = await three_turns()
    before = turns.conversation.messages
    q2 = before[2]
    exchange = turns.edit(q2.id, "q2, edited")
    await answer(turns, exchange)
    assert texts(turns) == ["q1", "answer 1", "q2, edited", "answer 4"]
    assert sent(backend) == [
        ("system", "Be brief."),
        ("user", "q1"),
        ("assistant", "answer 1"),
        ("user", "q2, edited"),
    ]
    assert turns.conversation.siblings(exchange.user) == [q2, exchange.user]
    # the old branch is whole: q2, its answer, q3 and its answer
    old = turns.conversation.path(before[-1].id)
    assert [m.content for m in old[1:]] == ["q1", "answer 1", "q2", "answer 2", "q3", "answer 3"]
    # switching back shows it, and the chat goes on there
    assert turns.show_sibling(exchange.user.id, -1) is q2
    assert texts(turns) == [m.content for m in before]
    await ask(turns, "q4")
    assert sent(backend)[-3:] == [("user", "q3"), ("assistant", "answer 3"), ("user", "q4")]
    assert turns.show_sibling(q2.id, -1) is None  # none before the first


async def test_a_new_system_prompt_starts_a_branch_at_the_root_with_copies() -> None:
    turns, backend = await three_turns(system="Be brief.")
    old_branch = turns.conversation.path()
    turns.update_settings(system="Answer in French.")
    assert turns.system_changed and turns.conversation.system == "Be brief."  # not yet
    exchange = turns.retry()  # the last question, answered with the new system prompt
    await answer(turns, exchange)
    assert turns.conversation.system == "Answer in French." and not turns.system_changed
    assert texts(turns) == ["q1", "answer 1", "q2", "answer 2", "q3", "answer 4"]
    assert sent(backend)[0] == ("system", "Answer in French.")
    assert sent(backend)[1:] == sent(backend, 2)[1:]
    roots = turns.conversation.children(None)
    assert [r.content for r in roots] == ["Be brief.", "Answer in French."]
    assert turns.conversation.path(old_branch[-1].id) == old_branch  # untouched
    # the copies are new messages, not the old ones moved
    assert not {m.id for m in turns.conversation.path()} & {m.id for m in old_branch}
    # back to the first root: its system prompt is the one the next turn uses
    turns.show_sibling(roots[1].id, -1)
    assert turns.settings.system == "Be brief." and texts(turns)[-1] == "answer 3"


async def test_a_system_prompt_on_an_empty_chat_is_set_in_place() -> None:
    heard = Heard()
    turns = TurnController(Numbered(), Settings(system="old"))
    turns.subscribe(heard)
    assert turns.edit_system("new") is None  # nothing to answer yet
    assert turns.conversation.system == "new" and len(turns.conversation.children(None)) == 1
    assert heard.said == [("final", "new")]


async def test_listeners_hear_every_message_and_the_branch_shown() -> None:
    turns, _ = await three_turns()
    heard = Heard()
    turns.subscribe(heard)
    q3 = turns.conversation.messages[4]
    await answer(turns, turns.edit(q3.id, "q3b"))
    assert heard.said[:2] == [("added", "q3b"), ("added", "")]
    assert heard.said[-1] == ("final", "answer 4")
    turns.show_sibling(turns.conversation.messages[4].id, -1)
    assert heard.said[-1] == ("shown", "answer 3")
    turns.unsubscribe(heard)
    await ask(turns, "q4")
    assert heard.said[-1] == ("shown", "answer 3")  # no longer told


async def test_one_turn_at_a_time_and_bad_edits_are_refused_before_anything_changes() -> None:
    turns, _ = await three_turns()
    tree = list(turns.conversation.every())
    reply = turns.conversation.messages[1]
    bad_inputs: list[Callable[[], object]] = [
        lambda: turns.edit(reply.id, "an answer is not a question"),
        lambda: turns.edit(999_999, "no such message"),
        lambda: turns.edit(turns.conversation.messages[0].id, "   "),
        lambda: turns.begin("\udcff"),
    ]
    for bad in bad_inputs:
        with pytest.raises(InputError):
            bad()
    assert list(turns.conversation.every()) == tree
    exchange = turns.begin("q4")
    assert turns.busy and turns.current is exchange
    with pytest.raises(InputError, match="still answering"):
        turns.begin("q5")
    with pytest.raises(InputError, match="still answering"):
        turns.retry()
    assert turns.stop()  # begun, never run: finished as cancelled
    assert not turns.busy and exchange.answer.status == "cancelled"
    await answer(turns, exchange)  # a stopped turn runs no request
    assert exchange.trace.t_first_token is None


class Stalls(Numbered):
    """Says "partial", then stalls until stopped; closing its stream takes `close_s`
    (a request's connection, a llama thread)."""

    def __init__(self, close_s: float = 0.0) -> None:
        super().__init__()
        self.streaming = asyncio.Event()
        self.close_s = close_s

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield TextDelta("partial")
        self.streaming.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(self.close_s)
        yield Finished("stop")


async def test_stop_ends_a_streaming_turn_at_once_and_keeps_its_text() -> None:
    backend = Stalls()
    streaming = backend.streaming
    turns = TurnController(backend)
    exchange = turns.begin("go")

    async def consume() -> None:
        async for _ in turns.run(exchange):
            pass

    task = asyncio.create_task(consume())
    await streaming.wait()
    assert turns.stop()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (exchange.answer.status, exchange.answer.content) == ("cancelled", "partial")
    assert not turns.busy and not turns.stop()


async def test_the_consumers_pace_is_asked_of_the_backend_per_request() -> None:
    asked: list[float | None] = []

    class Paced(Numbered):
        async def stream(
            self, request: GenerationRequest, *, every_s: float | None = None
        ) -> AsyncIterator[Event]:
            asked.append(every_s)
            async for event in super().stream(request):
                yield event

    turns = TurnController(Paced())
    await ask(turns, "a")
    turns.deliver_every(0.2)
    await ask(turns, "b")
    assert asked == [None, 0.2]


async def test_a_summary_of_another_branch_is_not_sent() -> None:
    turns, _ = await three_turns()
    path = turns.conversation.messages
    covers = frozenset(m.id for m in path[:4])
    trimmer = turns.trimmer
    trimmer.summary = Summary("the first two turns", covers, "s", "m", metrics_from_dict({}))
    assert turns.request().messages[0].content.endswith("the first two turns")
    turns.retry()  # the same start: the summary still stands for it
    turns.stop()
    assert trimmer.summary is not None
    turns.edit(path[2].id, "q2b")  # a branch inside what it covers: it no longer applies
    turns.stop()
    assert trimmer.summary is None
    assert turns.request().messages[:2] == (Message("system", "Be brief."), Message("user", "q1"))


def test_a_branch_shown_from_a_question_ends_at_its_newest_answer() -> None:
    root = ChatMessage("system", "sys")
    q = ChatMessage("user", "q", parent=root.id)
    first = ChatMessage("assistant", "a1", parent=q.id)
    second = ChatMessage("assistant", "a2", parent=q.id)
    third = ChatMessage("assistant", "a3", parent=q.id)
    # then the user went back to the first answer and asked on: the newest message
    q2 = ChatMessage("user", "q2", parent=first.id)
    tree = [root, q, first, second, third, q2]
    # shown from the question down, no answer chosen yet: the newest (a retry) is shown
    c = Conversation.from_tree(tree, leaf=q.id)
    assert c.leaf == third.id
    assert (c.branch_of(second), c.branch_of(third)) == ((2, 3), (3, 3))
    # no leaf saved: the newest message's branch, though a3 is q's newest answer
    c = Conversation.from_tree(tree, leaf=None)
    assert c.leaf == q2.id and [m.content for m in c.messages] == ["q", "a1", "q2"]
    assert q2.id in c and third.id in c and 999_999 not in c


def test_a_chat_rewound_before_its_root_shows_and_sends_nothing() -> None:
    c = Conversation("sys", [ChatMessage("user", "q"), ChatMessage("assistant", "a")])
    c.rewind(None)  # a new system prompt is about to start a new root
    assert (c.messages, c.prompt_messages(), c.path()) == ([], (), [])


async def test_the_last_request_is_what_the_branchs_last_answer_answered() -> None:
    turns, _ = await three_turns()
    assert turns.last_request() == (
        (
            Message("system", "Be brief."),
            Message("user", "q1"),
            Message("assistant", "answer 1"),
            Message("user", "q2"),
            Message("assistant", "answer 2"),
            Message("user", "q3"),
        ),
        "answer 3",
    )


def test_no_last_request_before_an_answer_with_text() -> None:
    turns = TurnController(Numbered(), Settings(system="s"))
    assert turns.last_request() is None
    turns.conversation.add(ChatMessage("user", "q1"))
    assert turns.last_request() is None  # a question, no answer yet
    turns.conversation.add(ChatMessage("assistant", ""))
    assert turns.last_request() is None  # an answer with no text


async def test_the_request_and_its_trace_carry_every_setting_and_our_count() -> None:
    backend = Numbered()
    settings = Settings(system="S", max_tokens=33, temperature=0.25, stop=("##",), seed=7)
    turns = TurnController(backend, settings)
    await ask(turns, "a question")
    e = turns.exchanges[0]
    assert e.request == GenerationRequest(
        (Message("system", "S"), Message("user", "a question")), 33, 0.25, ("##",), 7
    )
    # the scripted count: len // 4 + 3 a message: 3 + 5 = 8, estimated
    t = e.trace
    assert (t.backend, t.model, t.max_tokens) == ("scripted", "scripted-model", 33)
    assert (t.prompt_estimate, t.prompt_estimate_exact) == (8, False)
    assert (t.window, t.window_source) == (None, None)
    assert e.token_times_ms() == [t.times[0] / 1e6]
    assert e.metrics is not None and e.metrics.finish == "stop"
    assert (e.answer.status, e.answer.content, e.answer.backend) == (
        "complete",
        "answer 1",
        "scripted",
    )


async def test_show_sibling_steps_within_the_siblings_only() -> None:
    turns, _ = await three_turns()
    q3 = turns.conversation.questions()[2]
    for text in ("q3b", "q3c"):
        await answer(turns, turns.edit(turns.conversation.questions()[2].id, text))
    first, middle, last = turns.conversation.siblings(q3)
    assert turns.show_sibling(first.id, -1) is None  # none before the first
    assert turns.show_sibling(last.id, 1) is None  # none after the last
    assert turns.show_sibling(middle.id, 1) is last
    assert texts(turns)[-2:] == ["q3c", "answer 5"]
    assert turns.show_sibling(last.id, -2) is first
    assert texts(turns)[-2:] == ["q3", "answer 3"]


class Failing(ScriptedBackend):
    """Sends `text` (maybe nothing), then fails with an error of `kind`."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__()
        self.kind, self.partial = kind, text

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if self.partial:
            yield TextDelta(self.partial)
        yield StreamError(self.kind, "it failed")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "text", "question"),
    [
        ("connection", "half an ans", "complete"),  # some text: the question is sent again
        ("connection", "", "error"),  # nothing: it would stand twice in a row
        ("context_overflow", "x", "error"),  # too long: it would overflow again
    ],
)
async def test_a_failed_answer_keeps_its_text_and_its_question_only_when_it_can_be_sent(
    kind: str, text: str, question: str
) -> None:
    turns = TurnController(Failing(kind, text), Settings(system="s"))
    turns.trimmer.enabled = False
    await ask(turns, "q")
    e = turns.exchanges[0]
    assert (e.answer.status, e.answer.error, e.answer.content) == ("error", "it failed", text)
    assert e.user.status == question
    assert e.user.error == ("it failed" if question == "error" else None)
    assert e.metrics is not None and e.metrics.finish == "error" and not turns.busy


async def test_a_turns_subscribers_hear_each_stream_event_then_its_end_with_its_metrics() -> None:
    turns = TurnController(ScriptedBackend(text="one two three"))
    everything: list[TurnEvent] = []
    turns.subscribe(everything.append)
    turn = turns.send("go")
    own: list[TurnEvent] = []
    turn.subscribe(own.append)
    await turn
    assert turn.done and not turns.busy
    texts = [
        e.event.text for e in own if isinstance(e, Streamed) and isinstance(e.event, TextDelta)
    ]
    assert texts == ["one ", "two ", "three "]
    assert isinstance(own[-2], Streamed) and isinstance(own[-2].event, Finished)
    ended = own[-1]
    assert isinstance(ended, TurnEnded) and ended.exchange is turn.exchange
    assert ended.metrics is turn.exchange.metrics and ended.metrics.finish == "stop"
    assert not any(isinstance(e, TurnFailed) for e in own)
    # the controller's subscribers hear every turn's events (and the conversation's)
    assert [e for e in everything if isinstance(e, Streamed | TurnFailed | TurnEnded)] == own


async def test_a_failed_turn_says_why_before_its_end() -> None:
    class Fails(ScriptedBackend):
        async def stream(
            self, request: GenerationRequest, *, every_s: float | None = None
        ) -> AsyncIterator[Event]:
            yield TextDelta("half")
            yield StreamError("server", "it broke")

    turns = TurnController(Fails())
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    await turns.send("go")
    failed, ended = heard[-2:]
    assert isinstance(failed, TurnFailed) and failed.error == "it broke"
    assert isinstance(ended, TurnEnded) and ended.metrics.finish == "error"


async def test_a_caller_cancelled_while_it_awaits_a_turn_stops_it_and_the_text_stays() -> None:
    backend = Stalls(close_s=0.2)  # the turn is over only once its stream is closed
    streaming = backend.streaming
    turns = TurnController(backend)
    exchange = turns.begin("go")

    async def caller() -> None:
        await turns.run(exchange)

    task = asyncio.create_task(caller())
    await streaming.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the caller's CancelledError came once the answer was final
    assert (exchange.answer.status, exchange.answer.content) == ("cancelled", "partial")
    assert not turns.busy


async def test_a_turn_stopped_before_its_first_step_is_finished_as_cancelled() -> None:
    turns = TurnController(ScriptedBackend(text="never"))
    heard: list[TurnEvent] = []
    turns.subscribe(heard.append)
    turn = turns.send("go")
    assert turns.stop()  # the task has not run a step yet
    with pytest.raises(asyncio.CancelledError):
        await turn
    exchange = turn.exchange
    assert (exchange.answer.status, exchange.answer.content) == ("cancelled", "")
    assert not turns.busy and not turns.stop()
    assert [type(e) for e in heard if isinstance(e, Streamed | TurnEnded)] == [TurnEnded]
