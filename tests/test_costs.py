"""What a send or a switch would cost (chat/costs.py), on a scripted server whose usage
is known: the cache guessed for a server that hides it, a prompt held whole, and the
re-prefill of a switch in seconds."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from phasechat.backends.base import RenderedPrompt, TokenCount
from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    Usage,
)
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.costs import (
    DraftForecast,
    Expected,
    SwitchCost,
    expect,
    held_prefix,
    history_metrics,
)
from phasechat.chat.turns import TurnController
from phasechat.telemetry.forecast import Forecast, Rates
from phasechat.telemetry.metrics import metrics_from_dict
from tests.helpers import ask
from tests.scripted import ScriptedBackend


class Server(ScriptedBackend):
    """A server that reports a 40-token prompt with `cached` of it cached, and an answer
    of 30 tokens of which `thinking` are its thinking (0: it does not think)."""

    def __init__(self, thinking: int, cached: int | None = 0) -> None:
        super().__init__("server")
        self.thinking, self.cached = thinking, cached

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if self.thinking:
            yield ReasoningDelta("let me see")
        yield TextDelta("an answer")
        yield Usage(40, 30, self.cached, self.thinking or None)
        yield Finished("stop")


def settle(forecasts: DraftForecast, turns: TurnController, draft: str) -> Forecast:
    deadline = time.monotonic() + 30  # a limit for a hang, not a timing asserted
    while time.monotonic() < deadline:
        forecasts.update(turns, draft)
        if (f := forecasts.of(draft)) is not None:
            return f
        time.sleep(0.01)
    raise AssertionError("no forecast")


@pytest.mark.parametrize(
    ("thinking", "cached", "guess"),
    [
        # the server holds the prompt (40) and the answer; the thinking (20 of the 30
        # tokens) is not in the next prompt, so the shared prefix ends where it began
        (20, 0, 40),
        (0, 0, 70),  # no thinking: the prompt and the whole answer
        (0, None, 0),  # a server never seen to report a cache: none assumed
    ],
)
async def test_a_drafts_cache_guess_on_a_server_that_hides_it(
    thinking: int, cached: int | None, guess: int
) -> None:
    turns = TurnController(Server(thinking, cached), Settings(max_tokens=16))
    await ask(turns, "first question")
    forecasts = DraftForecast(every_s=0)
    try:
        f = settle(forecasts, turns, "x" * 400)  # 100 tokens: the prompt is over 70
    finally:
        forecasts.close()
    # the history and the draft, counted apart (the scripted count adds up exactly)
    whole = (*turns.request().messages, Message("user", "x" * 400))
    assert f.prompt_tokens == turns.backend.count_tokens(whole).tokens > 100
    assert (f.cached_tokens, f.max_tokens, f.estimated_tokens) == (guess, 16, True)


async def test_a_drafts_cache_guess_is_at_most_its_prompt() -> None:
    """Issue 49: the guess (the last prompt and answer, 70 tokens) is longer than a short
    draft's whole prompt: the forecast keeps the prompt, not more than it has."""
    turns = TurnController(Server(0, 0), Settings(max_tokens=16))
    await ask(turns, "first question")
    forecasts = DraftForecast(every_s=0)
    try:
        f = settle(forecasts, turns, "x")
    finally:
        forecasts.close()
    assert f.prompt_tokens < 70
    assert f.cached_tokens == f.prompt_tokens and f.new_tokens == 0


async def test_a_prompt_held_whole_is_forecast_to_read_its_last_token_again() -> None:
    turns = TurnController(Server(0), Settings())
    messages = turns.preview("a question")
    held = expect(turns, messages, exact=(100, 100))
    assert held == Expected(100, 99, None, False, None)
    assert held.evaluated_tokens == 1
    assert held.line() == "keeps 99 cached, reads 1 again (TTFT: not measured on this backend yet)"
    part = expect(turns, messages, exact=(100, 60))
    assert (part.cached_tokens, part.evaluated_tokens) == (60, 40)
    assert expect(turns, messages, exact=(1, 1)).cached_tokens == 0


async def test_the_expected_ttft_and_the_last_one_beside_it() -> None:
    turns = TurnController(Server(0, cached=0), Settings())
    await ask(turns, "q1")
    await ask(turns, "q2")
    messages = turns.preview("q3")
    e = expect(turns, messages, exact=(500, 100))
    last = turns.exchanges[-1].metrics
    assert last is not None and e.last_ttft_ms == last.ttft_ready_ms
    assert (e.prompt_tokens, e.cached_tokens, e.estimated) == (500, 100, False)
    assert e.line().startswith("keeps 100 cached, reads 400 again")
    cold = Expected(500, 0, 2500.0, True, 200.0)
    assert cold.line() == "reads all ~500 tokens again: TTFT about 2.5 s (the last turn: 0.2 s)"


def test_a_switchs_re_prefill_is_in_seconds_with_its_fixed_cost() -> None:
    # 1,000 tokens at 100 tok/s: 10 s, and 200 ms fixed: 10.2 s (not 200 + 10)
    cost = SwitchCost(1000, True, False, Rates(100.0, 20.0, 3, overhead_ms=200.0))
    assert cost.reprefill_s == pytest.approx(10.2)
    # attention to the cached tokens only: none are cached, so none more (priced with
    # the new tokens among themselves, 0.001 x 1,000 x 500.5: 10.7005 s)
    deep = SwitchCost(1000, False, True, Rates(100.0, 20.0, 3, 200.0, 0.001))
    assert deep.reprefill_s == pytest.approx(10.2)
    assert SwitchCost(1000, True, False, Rates(None, 20.0, 0)).reprefill_s is None


async def test_without_the_engines_count_the_cache_is_the_messages_shared_whole() -> None:
    # the scripted count: a message is len // 4 + 3 tokens. The last request was the
    # system prompt (5) and q1 (3), answered "an answer" (5): 13 tokens shared whole
    turns = TurnController(Server(0, cached=0), Settings(system="Be brief."))
    await ask(turns, "q1")
    e = expect(turns, turns.preview("q2"))
    assert (e.prompt_tokens, e.cached_tokens, e.estimated) == (16, 13, True)
    # an edit of q1: only the system prompt is shared
    edit = expect(turns, turns.preview("q1, edited", turns.conversation.questions()[0].id))
    assert (edit.prompt_tokens, edit.cached_tokens) == (5 + 5, 5)


class Rendering(Server):
    """A server with its own template and tokenizer: a token a word of "role: content"."""

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        words = [w for m in messages for w in f"{m.role}: {m.content}".split()]
        return RenderedPrompt(" ".join(words), tuple(w.encode() for w in words), "server")


async def test_the_held_prefix_is_counted_by_the_servers_own_tokens() -> None:
    turns = TurnController(Rendering(0), Settings(system="Be brief."))
    messages = turns.preview("one two")
    # nothing sent yet: every token is read
    assert await held_prefix(turns, messages) == (6, 0)  # system: Be brief. user: one two
    await ask(turns, "one two")
    # held: system: Be brief. user: one two assistant: an answer (9 tokens); the next
    # prompt shares its whole (9) and adds user: three (2)
    assert await held_prefix(turns, turns.preview("three")) == (11, 9)
    # an edit of the question: only the system prompt and "user:" are shared
    edit = turns.preview("uno", turns.conversation.questions()[0].id)
    assert await held_prefix(turns, edit) == (5, 4)
    e = expect(turns, edit, await held_prefix(turns, edit))
    assert (e.prompt_tokens, e.cached_tokens, e.estimated) == (5, 4, False)


def test_the_expected_line_names_a_cache_of_one_token_and_none() -> None:
    assert Expected(100, 1, None, False, None).line() == (
        "keeps 1 cached, reads 99 again (TTFT: not measured on this backend yet)"
    )
    assert Expected(100, 0, 1234.0, True, None).line() == (
        "reads all ~100 tokens again: TTFT about 1.2 s"
    )


async def test_the_last_ttft_set_beside_the_forecast_is_from_the_ready_model() -> None:
    # a saved answer that waited 4 s for the model to load: its TTFT from the ready
    # model is 1 s, not the 5 s the user waited
    turns = TurnController(Server(0), Settings())
    saved = metrics_from_dict(
        {"backend": "server", "model": "m", "finish": "stop", "ttft_ms": 5000.0, "load_ms": 4000.0}
    )
    turns.conversation.add(ChatMessage("user", "q"))
    turns.conversation.add(ChatMessage("assistant", "a", "server", "m", metrics=saved))
    e = expect(turns, turns.preview("next"), exact=(50, 0))
    assert e.last_ttft_ms == 1000.0


class Counted(Server):
    """Counts as the scripted server does, noting each draft it was asked to count."""

    def __init__(self) -> None:
        super().__init__(0)
        self.asked: list[str] = []

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        self.asked.append(messages[-1].content)
        return super().count_tokens(messages)


def test_a_draft_forecast_starts_at_most_one_count_every_interval() -> None:
    backend = Counted()
    turns = TurnController(backend, Settings())
    forecasts = DraftForecast(every_s=0)
    try:
        first = settle(forecasts, turns, "one")
        forecasts.every_s = 3600  # an hour from the last count: no second one in this test
        assert forecasts.update(turns, "two words") is first  # the last one, at once
        # no count of the new draft starts (given half a second to show that it did not)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and "two words" not in backend.asked:
            time.sleep(0.01)
        assert "two words" not in backend.asked
        assert forecasts.of("two words") is None and forecasts.of("one") is first
        forecasts.every_s = 0
        second = settle(forecasts, turns, "two words")
        assert second.prompt_tokens > first.prompt_tokens
    finally:
        forecasts.close()
    blank = DraftForecast(every_s=0)
    try:
        assert blank.update(turns, "   ") is None  # nothing to send: no forecast
    finally:
        blank.close()


async def test_the_history_is_the_saved_answers_then_this_sessions_each_once() -> None:
    turns = TurnController(Server(0), Settings())
    saved = metrics_from_dict({"backend": "server", "model": "m", "finish": "stop"})
    turns.conversation.add(ChatMessage("user", "old q"))
    turns.conversation.add(ChatMessage("assistant", "old a", "server", "m", metrics=saved))
    await ask(turns, "new q")
    ran = turns.exchanges[0].metrics
    assert ran is not None
    # the new answer's metrics are on its message too: counted once, after the saved one
    assert [id(m) for m in history_metrics(turns)] == [id(saved), id(ran)]
