"""Two sibling branches compared (chat/trips/branches.py) without the UI: each side is
its question's newest answer, with its own prompt, named by its place among them."""

from __future__ import annotations

from phasechat.backends.events import Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trips.branches import answer_of, branch_comparison
from phasechat.chat.turns import TurnController
from phasechat.telemetry.metrics import metrics_from_dict
from tests.helpers import answer, ask
from tests.test_turns import Numbered


def test_a_questions_answer_is_its_newest() -> None:
    c = Conversation("sys")
    q = c.add(ChatMessage("user", "q"))
    first = c.add(ChatMessage("assistant", "a1"))
    c.rewind(q.id)
    second = c.add(ChatMessage("assistant", "a2"))
    c.rewind(q.id)
    third = c.add(ChatMessage("assistant", "a3"))
    assert answer_of(c, q) is third
    assert answer_of(c, first) is first and answer_of(c, second) is second  # an answer: itself
    lone = c.add(ChatMessage("user", "unanswered"))
    assert answer_of(c, lone) is None


async def test_an_edited_question_is_compared_by_its_newest_answer() -> None:
    turns = TurnController(Numbered(), Settings(system="Be brief."))
    await ask(turns, "q1")  # answer 1
    await answer(turns, turns.edit(turns.conversation.questions()[0].id, "q1b"))  # answer 2
    await answer(turns, turns.retry())  # answer 3: q1b's newest
    edited = turns.conversation.questions()[0]
    assert edited.content == "q1b"
    c = branch_comparison(turns, edited)
    assert [s.name for s in c.sides] == ["‹1/2›", "‹2/2›"]
    assert [x.text for x in c.answers] == ["answer 1", "answer 3"]
    a, b = (side.messages for side in c.sides)
    assert a == (Message("system", "Be brief."), Message("user", "q1"))
    assert b == (Message("system", "Be brief."), Message("user", "q1b"))
    assert [x.metrics is not None for x in c.answers] == [True, True]
    assert (c.cold, c.together) == (True, False)


async def test_a_middle_branch_is_compared_with_the_next_and_the_last_with_the_one_before() -> None:
    turns = TurnController(Numbered(), Settings())
    await ask(turns, "q1")  # answer 1
    for text in ("q1b", "q1c"):  # answers 2 and 3
        await answer(turns, turns.edit(turns.conversation.questions()[0].id, text))
    siblings = turns.conversation.siblings(turns.conversation.questions()[0])
    assert [m.content for m in siblings] == ["q1", "q1b", "q1c"]
    middle = branch_comparison(turns, siblings[1])
    assert [s.name for s in middle.sides] == ["‹2/3›", "‹3/3›"]
    assert [x.text for x in middle.answers] == ["answer 2", "answer 3"]
    last = branch_comparison(turns, siblings[2])
    assert [s.name for s in last.sides] == ["‹2/3›", "‹3/3›"]
    first = branch_comparison(turns, siblings[0])
    assert [x.text for x in first.answers] == ["answer 1", "answer 2"]


def test_a_saved_chats_branches_are_compared_with_the_prompts_their_answers_had() -> None:
    # a chat read back from the database: no exchange of this session sent its answers,
    # so each side's prompt is its branch up to the question, not the answer itself
    done = metrics_from_dict({"backend": "b", "model": "m", "finish": "stop", "ttft_ms": 9.0})
    c = Conversation("sys")
    q = c.add(ChatMessage("user", "q"))
    c.add(ChatMessage("assistant", "first", "b", "m", metrics=done))
    c.rewind(q.id)
    second = c.add(ChatMessage("assistant", "second", "b", "m", metrics=done))
    turns = TurnController(Numbered(), Settings(system="sys"))
    turns.replace_conversation(c)
    comparison = branch_comparison(turns, second)
    assert [s.messages for s in comparison.sides] == [
        (Message("system", "sys"), Message("user", "q")),
        (Message("system", "sys"), Message("user", "q")),
    ]
    assert [x.text for x in comparison.answers] == ["first", "second"]
    assert [x.metrics for x in comparison.answers] == [done, done]
