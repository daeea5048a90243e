"""The trimmer's arithmetic on a backend that counts one token a word: which turns a trim
summarizes, the goal it cuts to, and when a send is over budget. Known answers worked out
here turn by turn (a plain loop, not the trimmer's binary search); the trimmer against the
real model is tests/test_trimmer.py and tests/test_trim_hold.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from phasechat.backends.base import TokenCount
from phasechat.backends.events import Event, GenerationRequest, Message
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trim.summarize import Summary
from phasechat.chat.trim.trimmer import CALM_TURNS, SendPlan, Trimmer, measured_prefill_rate
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
# 180 -> 54 (2: 43), 100 -> 14 (none fits: the last turn alone); at the edges: 440 -> 184
# (all but the first, 183), 158 -> 43 (2 turns, exactly), 156 -> 42 (they are 1 over)
@pytest.mark.parametrize("budget", [440, 400, 260, 180, 158, 156, 100])
@pytest.mark.parametrize("keep_last", [0, 1, 2, 4, 7])
async def test_a_trim_summarizes_the_fewest_oldest_turns_that_reach_the_goal(
    budget: int, keep_last: int
) -> None:
    expected = {440: 7, 400: 6, 260: 3, 180: 2, 158: 2, 156: 1, 100: 1}[budget]
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
    assert Trimmer(target=1.0).goal(1000) == 1000


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


@pytest.mark.parametrize(
    ("evaluated", "rate"),
    # 400 tokens in 0.5 s, plus one answer at the 32-token threshold or one below it
    [(31, 800.0), (32, 432 / 0.6), (33, 433 / 0.6)],
)
def test_a_prefill_of_32_evaluated_tokens_counts_in_the_rate_and_31_does_not(
    evaluated: int, rate: float
) -> None:
    answers = [_prefilled(1000, 600, 500.0), _prefilled(evaluated + 50, 50, 100.0)]
    assert measured_prefill_rate(answers) == pytest.approx(rate)


@pytest.mark.parametrize("system", ["Be terse.", ""])
async def test_the_summary_follows_the_users_system_prompt_in_one_system_message(
    system: str,
) -> None:
    backend, conversation = Words(), chat()
    conversation.root.content = system
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert trimmer.start(backend, conversation, max_tokens=32)
    assert (await trimmer.wait(SendPlan(wait=True))).trimmed
    head = f"{system}\n\n" if system else ""
    expected = f"{head}Summary of the earlier conversation:\nRosa keeps bees in Porto."
    sent = trimmer.prompt_messages(conversation)
    assert sent[0] == Message("system", expected)
    # then the last two turns, verbatim: 180 / 2 - 36 = 54 holds (3, 22) and (8, 10)
    assert [m.content.split()[0] for m in sent[1:]] == ["q6", "a6", "q7", "a7"]


class Window(Words):
    """Words, with a context window of its own, estimated counts or not, and every
    request it was sent kept."""

    def __init__(self, window: int | None = None, exact: bool = True) -> None:
        super().__init__()
        self.context_window = window
        self.exact_token_counts = exact
        self.requests: list[GenerationRequest] = []
        self.warmed: list[tuple[Message, ...]] = []

    async def warm(self, messages: tuple[Message, ...]) -> int:
        self.warmed.append(messages)
        return 0

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests.append(request)
        async for event in super().stream(request):
            yield event


# n_ctx - max_tokens - 64, less a tenth of n_ctx when counts are estimates; at least 1
@pytest.mark.parametrize(
    ("context", "window", "told", "exact", "budget"),
    [
        (2000, 4096, None, True, 2000 - 100 - 64),  # a set context wins over the backend's
        (2005, None, None, False, 2005 - 100 - 64 - 200),  # a tenth of 2005, in tokens
        (None, 4096, None, True, 4096 - 100 - 64),
        (None, 4096, 1000, True, 1000 - 100 - 64),  # the window a server named when refusing
        (None, None, None, True, 8192 - 100 - 64),  # unknown: DEFAULT_CONTEXT
        (None, 0, None, True, 8192 - 100 - 64),
        (165, None, None, True, 1),  # 165 - 100 - 64: one token left
        (164, None, None, True, 1),  # none left, never 0 or less
        (150, None, None, False, 1),
    ],
)
def test_the_budget_is_the_window_less_the_answer_the_margin_and_the_estimate_slack(
    context: int | None, window: int | None, told: int | None, exact: bool, budget: int
) -> None:
    backend = Window(window, exact)
    trimmer = Trimmer(context=context)
    if told:
        trimmer.windows[backend.name] = told
    assert trimmer.budget_for(backend, max_tokens=100) == budget
    assert Trimmer(budget=777, context=context).budget_for(backend, 100) == 777


@pytest.mark.parametrize(
    ("budget", "limit"),
    # an eighth of the budget, from 16 up to 256
    [
        (100, 16),
        (128, 16),
        (136, 17),
        (143, 17),
        (1000, 125),
        (2048, 256),
        (2056, 256),
        (9000, 256),
    ],
)
def test_a_summary_answer_is_an_eighth_of_the_budget_between_16_and_256_tokens(
    budget: int, limit: int
) -> None:
    assert Trimmer().summary_budget(budget) == limit
    assert Trimmer(summary_tokens=40).summary_budget(budget) == 40


def grown_to(conversation: Conversation, total: int) -> Conversation:
    """`conversation` with its last answer padded so the history is `total` words."""
    last = conversation.messages[-1]
    others = sum(len(m.content.split()) for m in conversation.messages[:-1])
    last.content = " ".join(["a"] * (total - others))
    return conversation


#: the history after each answer: it grows 40, 20, 60, 0, 30 tokens a turn
HISTORY = [300, 340, 360, 420, 420, 450]


@pytest.mark.parametrize(
    ("lookahead", "budget", "starts"),
    # the last three answers grew 60, 0 (not growth) and 30: 45 a turn, from 450
    [(1, 495, False), (1, 494, True), (2, 540, False), (2, 539, True)],
)
async def test_a_summary_starts_when_the_next_turns_average_growth_would_not_fit(
    lookahead: int, budget: int, starts: bool
) -> None:
    backend, conversation = Words(), chat()
    trimmer = Trimmer(budget=10**6, summary_tokens=SUMMARY, lookahead=lookahead)
    for total in HISTORY[:-1]:
        assert not trimmer.after_answer(backend, grown_to(conversation, total), max_tokens=32)
    trimmer.budget = budget
    assert trimmer.after_answer(backend, grown_to(conversation, HISTORY[-1]), 32) == starts
    assert trimmer.pending == starts
    await trimmer.aclose()


@pytest.mark.parametrize(("budget", "starts"), [(364, False), (363, True)])
async def test_after_the_first_answer_a_turn_is_assumed_to_grow_max_tokens_and_32(
    budget: int, starts: bool
) -> None:
    backend, trimmer = Words(), Trimmer(budget=budget, summary_tokens=SUMMARY)
    assert trimmer.after_answer(backend, grown_to(chat(), 300), max_tokens=32) == starts
    await trimmer.aclose()


@pytest.mark.parametrize(
    ("budget", "goal"),
    # the last four growths are 20, 60, 0 and 30: 110 / 3 a turn, CALM_TURNS of them
    [(250, 103), (400, 200)],  # 250 - 146.7 is under 125; 400 / 2 is under 253.3
)
def test_the_goal_uses_the_growth_of_the_last_four_turns_that_grew(budget: int, goal: int) -> None:
    backend, conversation, trimmer = Words(), chat(), Trimmer(budget=10**6)
    for total in HISTORY:
        trimmer.after_answer(backend, grown_to(conversation, total), max_tokens=32)
    assert trimmer.goal(budget) == goal


@pytest.mark.parametrize(("limit", "words"), [(20, 12), (16, 10), (15, 10), (100, 60)])
async def test_the_summary_is_asked_for_in_three_fifths_of_its_token_limit_in_words(
    limit: int, words: int
) -> None:
    backend = Window()
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=limit)
    assert trimmer.start(backend, chat(), max_tokens=32)
    await trimmer.wait(SendPlan(wait=True))
    (request,) = backend.requests
    assert f"in at most {words} words" in request.messages[-1].content
    assert (request.max_tokens, request.temperature) == (limit, 0.0)


# the summary request: the first 6 turns (174 words) and the instruction (26 words), in
# the window less the summary's 20 tokens and half the margin: 200 + 20 + 32
@pytest.mark.parametrize(("window", "shortened"), [(252, False), (251, True)])
async def test_turns_to_summarize_are_shortened_only_when_they_overflow_the_summarizers_window(
    window: int, shortened: bool
) -> None:
    backend, conversation = Window(window), chat()
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert trimmer.start(backend, conversation, max_tokens=32)
    await trimmer.wait(SendPlan(wait=True))
    (request,) = backend.requests
    turns = [m.content for m in request.messages[:-1]]
    assert (len(turns), any("[...]" in t for t in turns)) == (12, shortened)
    assert trimmer.covered == {m.id for m in conversation.messages[:12]}


async def test_each_send_counts_the_tokens_the_summary_cut_never_below_zero() -> None:
    backend, conversation = Words(), chat()  # 217 words of history
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert trimmer.sent(backend, conversation, 100) == 0  # no summary yet: nothing cut
    assert trimmer.start(backend, conversation, max_tokens=32)
    assert (await trimmer.wait(SendPlan(wait=True))).trimmed
    cuts = [trimmer.sent(backend, conversation, sent) for sent in (100, 300, 200)]
    assert cuts == [117, 0, 17]  # 300: the server counted more than the whole history
    assert (trimmer.last_tokens_cut, trimmer.tokens_cut_total) == (17, 134)
    stats = trimmer.stats(backend, 32, [_prefilled(1000, 600, 500.0)])  # 800 tok/s
    assert (stats.tokens_cut, stats.tokens_cut_total) == (17, 134)
    assert stats.prefill_s_saved == pytest.approx(134 / 800)
    assert (stats.summaries, stats.summarized_messages) == (1, 12)
    trimmer.enabled = False  # switched off: the whole history is sent, nothing cut
    assert trimmer.sent(backend, conversation, 100) == 0 and trimmer.last_tokens_cut == 0
    trimmer.enabled, trimmer.summary = True, None
    assert trimmer.sent(backend, conversation, 100) == 0 and trimmer.tokens_cut_total == 134


def test_the_panel_shows_the_newest_summarys_cost_and_every_summarys_time() -> None:
    def summary(covers: range, ttft: float, e2e: float | None, tokens: int) -> Summary:
        figures = {"ttft_ms": ttft, "e2e_ms": e2e, "output_tokens": tokens}
        return Summary("s", frozenset(covers), "b", "m", metrics_from_dict(figures))

    trimmer = Trimmer(budget=500)
    first, unknown, newest = (
        summary(range(4), 90.0, 700.0, 30),
        summary(range(6), 60.0, None, 25),
        summary(range(8), 40.0, 300.0, 20),
    )
    trimmer.summaries = [first, unknown, newest]
    trimmer.summary = newest
    stats = trimmer.stats(Words(), 32, [])
    assert (stats.summary_ttft_ms, stats.summary_e2e_ms, stats.summary_tokens) == (40, 300, 20)
    assert (stats.summaries, stats.summarized_messages, stats.budget) == (3, 8, 500)
    assert stats.summary_ms_total == 1000.0
    assert (stats.prefill_tok_s, stats.prefill_s_saved) == (None, None)
    assert (stats.tokens_cut, stats.tokens_cut_total) == (0, 0)  # nothing sent yet
    # counts are estimates when the backend's are, or when its count says so
    assert not stats.estimated
    assert trimmer.stats(Window(exact=False), 32, []).estimated
    assert trimmer.sent(ScriptedBackend(), Conversation(), 0) == 0  # a count: an estimate
    assert trimmer.stats(Words(), 32, []).estimated


async def test_a_summary_stays_while_every_message_it_covers_is_on_the_branch_shown() -> None:
    backend, conversation = Words(), chat()
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert trimmer.start(backend, conversation, max_tokens=32)
    assert (await trimmer.wait(SendPlan(wait=True))).trimmed
    covered = trimmer.covered
    trimmer.follow(conversation)  # the same branch: it stays
    assert trimmer.summary is not None and trimmer.covered == covered
    # rewound to the last message it covers (q6 is about to be edited): it still stands
    a4, a5 = conversation.messages[9], conversation.messages[11]
    conversation.rewind(a5.id)
    trimmer.follow(conversation)
    assert trimmer.covered == covered == {m.id for m in conversation.messages}
    # a branch inside what it covers (q5 edited): it no longer applies
    conversation.rewind(a4.id)
    conversation.add(ChatMessage("user", "q5 edited"))
    trimmer.follow(conversation)
    assert trimmer.summary is None and trimmer.covered == frozenset()


# it covers the first 12 messages: rewound to the last of them, then q6 edited; or q5 edited
@pytest.mark.parametrize(
    ("at", "edit", "dropped"), [(11, False, False), (11, True, False), (9, True, True)]
)
async def test_a_summary_being_written_is_dropped_when_the_branch_leaves_what_it_covers(
    at: int, edit: bool, dropped: bool
) -> None:
    backend, conversation = Words(), chat()
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert trimmer.start(backend, conversation, max_tokens=32)
    conversation.rewind(conversation.messages[at].id)
    if edit:
        conversation.add(ChatMessage("user", "edited"))
    trimmer.follow(conversation)
    assert trimmer.pending != dropped
    plan = await trimmer.wait(SendPlan(wait=True))
    assert plan.trimmed != dropped
    await trimmer.aclose()


@pytest.mark.parametrize(
    ("over", "serial", "own", "waits"),
    [
        (0, False, True, False),  # fits: sent in full while the summary is written
        (1, False, True, True),  # one token over: waits for it
        (0, True, True, True),  # the summary holds the chat's own local model
        (0, True, False, False),  # ... or another backend's: the send need not queue
    ],
)
async def test_a_send_while_a_summary_is_written_waits_only_when_over_budget_or_queued(
    over: int, serial: bool, own: bool, waits: bool
) -> None:
    backend, conversation = Window(), chat()
    backend.serial = serial
    trimmer = Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    if not own:
        trimmer.summarizer = Window()
    assert trimmer.start(backend, conversation, max_tokens=32)
    conversation.add(ChatMessage("user", "next"))  # 218 words to send
    trimmer.budget = 218 - over
    plan = trimmer.prepare(backend, conversation, max_tokens=32)
    assert (plan.wait, plan.serial) == (waits, waits and serial)
    assert plan.note == (None if waits else "summary not ready: sent full history")
    await trimmer.aclose()


async def test_a_send_says_when_it_is_over_budget_with_too_few_turns_to_summarize() -> None:
    backend, conversation = Words(), chat([(4, 30)])
    trimmer = Trimmer(budget=34)  # keeps the last 4 turns by default
    assert trimmer.prepare(backend, conversation, max_tokens=32) == SendPlan()  # fits
    trimmer.budget = 33
    assert trimmer.prepare(backend, conversation, max_tokens=32) == SendPlan(
        note="over budget (34 > 33 tokens) with too few turns to summarize "
        "(keeping the last 4): sent as is"
    )
    assert not trimmer.pending


class Slow(Window):
    """Writes its summary after 50 ms, or fails then."""

    def __init__(self, fails: bool = False) -> None:
        super().__init__()
        self.fails = fails

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        await asyncio.sleep(0.05)
        if self.fails:
            raise RuntimeError("out of memory")
        async for event in super().stream(request):
            yield event


@pytest.mark.parametrize("fails", [False, True])
async def test_a_send_that_waits_for_the_summary_says_how_long_or_why_it_failed(
    fails: bool,
) -> None:
    backend, trimmer = Slow(fails), Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert await trimmer.wait(SendPlan(wait=True, note="n")) == SendPlan(note="n")  # none
    assert trimmer.start(backend, chat(), max_tokens=32)
    t0 = time.perf_counter()
    plan = await trimmer.wait(SendPlan(wait=True, serial=True))
    outer = (time.perf_counter() - t0) * 1000
    # it slept 50 ms in there (a timer may fire a hair early)
    assert plan.waited_ms is not None and 49 <= plan.waited_ms <= outer
    if fails:
        assert not plan.trimmed and trimmer.summary is None
        assert plan.note == "summary failed: RuntimeError: out of memory; sent full history"
    else:
        assert plan.trimmed and trimmer.summary is not None
        assert plan.note == (
            f"waited {plan.waited_ms:,.0f} ms for the summary"
            " (the local model runs one request at a time)"
        )


@pytest.mark.parametrize(("fails", "prefill"), [(False, True), (False, False), (True, True)])
async def test_a_summary_written_after_an_answer_is_used_and_prefilled_at_once(
    fails: bool, prefill: bool
) -> None:
    backend, conversation = Slow(fails), chat()  # 217 words
    trimmer = Trimmer(budget=250, keep_last=2, summary_tokens=SUMMARY)
    trimmer.prefill = prefill
    assert not Trimmer(enabled=False, budget=100).after_answer(backend, conversation, 32)
    assert trimmer.after_answer(backend, conversation, max_tokens=32)  # 217 + 32 + 32 > 250
    assert not trimmer.after_answer(backend, conversation, max_tokens=32)  # one at a time
    assert trimmer._task is not None
    await asyncio.wait([trimmer._task])  # written (or failed) in the background
    for _ in range(3):  # its callback, then the pre-fill it starts
        await asyncio.sleep(0)
    conversation.add(ChatMessage("user", "next"))
    if fails:  # reported by the next send, which writes one again and waits for it
        assert trimmer.summary is None and backend.warmed == []
        plan = trimmer.prepare(backend, conversation, max_tokens=32)
        assert plan.note == "summary failed: RuntimeError: out of memory; sent full history"
    else:  # in use before the next send, whose prompt the backend has read already
        assert trimmer.summary is not None
        assert backend.warmed == ([trimmer.prompt_messages(conversation)[:-1]] if prefill else [])
        assert trimmer.prepare(backend, conversation, max_tokens=32) == SendPlan(trimmed=True)
        assert trimmer.prepare(backend, conversation, max_tokens=32) == SendPlan()
    await trimmer.aclose()


async def test_closing_cancels_the_summary_being_written() -> None:
    backend, trimmer = Slow(), Trimmer(budget=180, keep_last=2, summary_tokens=SUMMARY)
    assert trimmer.start(backend, chat(), max_tokens=32)
    task = trimmer._task
    await trimmer.aclose()
    assert task is not None and task.cancelled() and not trimmer.pending
    assert backend.requests == []  # cancelled before it was sent
