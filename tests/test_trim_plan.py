"""The trimmer's arithmetic on a backend that counts one token a word: which turns a trim
summarizes, the goal it cuts to, and when a send is over budget. Known answers worked out
here turn by turn (a plain loop, not the trimmer's binary search); the trimmer against the
real model is tests/test_trimmer.py and tests/test_trim_hold.py."""

from __future__ import annotations

import pytest

from phasechat.backends.base import TokenCount
from phasechat.backends.events import Message
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trim.trimmer import CALM_TURNS, Trimmer
from phasechat.chat.trim.types import SendPlan, measured_prefill_rate
from phasechat.telemetry.metrics import Metrics, metrics_from_dict
from tests.scripted import ScriptedBackend

SUMMARY = 20  # summary_tokens: a summary answer's limit
#: words of each turn's question and answer: every turn a different size
TURNS = [(4, 30), (9, 12), (6, 25), (11, 8), (5, 40), (7, 17), (3, 22), (8, 10)]


class Words(ScriptedBackend):
    """Counts one token a word, exactly; summarizes in a few words."""

    exact_token_counts = True

    def __init__(self) -> None:
        super().__init__("words", text="Rosa keeps bees in Porto.")

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        return TokenCount(sum(len(m.content.split()) for m in messages), estimated=False)


def chat(turns: list[tuple[int, int]] = TURNS) -> Conversation:
    c = Conversation()
    for i, (asked, answered) in enumerate(turns):
        c.add(ChatMessage("user", " ".join([f"q{i}"] * asked)))
        c.add(ChatMessage("assistant", " ".join([f"a{i}"] * answered)))
    return c


def turns_kept(budget: int, target: float, turns: list[tuple[int, int]]) -> int:
    """How many of the newest turns a trim keeps, worked out one cut at a time: the
    fewest oldest turns summarized that bring what is kept to the goal less the
    summary's limit and 16 tokens of framing; the last turn alone when none does."""
    room = int(budget * target) - SUMMARY - 16
    sizes = [a + b for a, b in turns]
    for cut in range(1, len(turns)):
        if sum(sizes[cut:]) <= room:
            return len(turns) - cut
    return 1


async def kept_after_trim(budget: int, keep_last: int, turns: list[tuple[int, int]]) -> int:
    backend, conversation = Words(), chat(turns)
    trimmer = Trimmer(budget=budget, keep_last=keep_last, summary_tokens=SUMMARY)
    assert trimmer.start(backend, conversation, max_tokens=32)
    plan = await trimmer.wait(SendPlan(wait=True))
    assert plan.trimmed, plan.note
    kept = [m for m in conversation.messages if not trimmer.is_summarized(m)]
    assert all(m.id in trimmer.covered for m in conversation.messages[: -len(kept)])
    return len(kept) // 2


# sizes 34 21 31 19 45 24 25 18; with target 0.5 the room for kept turns is
# budget / 2 - 36: 400 -> 164 (the last 6 turns, 162), 260 -> 94 (4: 112 is over, 3: 67),
# 180 -> 54 (2: 43), 100 -> 14 (none fits: the last turn alone)
@pytest.mark.parametrize("budget", [400, 260, 180, 100])
@pytest.mark.parametrize("keep_last", [1, 2, 4])
async def test_a_trim_summarizes_the_fewest_oldest_turns_that_reach_the_goal(
    budget: int, keep_last: int
) -> None:
    expected = {400: 6, 260: 3, 180: 2, 100: 1}[budget]
    assert turns_kept(budget, 0.5, TURNS) == expected
    assert await kept_after_trim(budget, keep_last, TURNS) == expected


async def test_two_turns_over_budget_summarize_the_first_and_keep_the_last() -> None:
    turns = [(40, 40), (30, 30)]
    assert await kept_after_trim(100, 4, turns) == 1


async def test_the_goal_leaves_room_for_four_turns_of_this_chats_growth() -> None:
    backend, conversation = Words(), Conversation()
    trimmer = Trimmer(budget=1000, summary_tokens=SUMMARY)
    for size in (100, 140, 160):  # the history: 100, 240, 400 tokens after each answer
        conversation.add(ChatMessage("user", " ".join(["q"] * (size // 2))))
        conversation.add(ChatMessage("assistant", " ".join(["a"] * (size // 2))))
        assert not trimmer.after_answer(backend, conversation, max_tokens=32)
    # growth of 140 then 160 tokens a turn: 150 on average, 4 such turns after the trim
    assert trimmer.goal(1000) == 1000 - CALM_TURNS * 150 == 400
    assert Trimmer().goal(1000) == 500  # no growth seen yet: target x budget


@pytest.mark.parametrize(("over", "waits"), [(0, False), (1, True)])
async def test_a_send_one_token_over_budget_waits_for_a_summary(over: int, waits: bool) -> None:
    backend, conversation = Words(), chat()
    conversation.add(ChatMessage("user", "next"))  # the question being sent
    tokens = sum(a + b for a, b in TURNS) + 1
    trimmer = Trimmer(budget=tokens - over, summary_tokens=SUMMARY)
    plan = trimmer.prepare(backend, conversation, max_tokens=32)
    assert (plan.wait, trimmer.pending) == (waits, waits)
    await trimmer.aclose()


def _prefilled(prompt: int, cached: int, ttft: float) -> Metrics:
    return metrics_from_dict(
        {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "evaluated_prompt_tokens": prompt - cached,
            "ttft_ms": ttft,
        }
    )


def test_the_panels_prefill_rate_is_evaluated_tokens_over_ttft() -> None:
    # (400 + 200) evaluated tokens over (0.5 + 0.25) s = 800 tok/s; a 10-token prefill skipped
    answers = [_prefilled(1000, 600, 500.0), _prefilled(200, 0, 250.0), _prefilled(510, 500, 40.0)]
    assert measured_prefill_rate([*answers, None]) == pytest.approx(800.0)
