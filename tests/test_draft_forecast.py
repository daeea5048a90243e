"""The forecast of a draft as it is typed (chat/costs.py DraftForecast), on the real
bundled model: its token count agrees with counting the whole prompt, the history is
counted once however many keystrokes follow, and the counting runs off the caller's
(the UI's) thread, so a 1 MB paste does not stop the keys."""

from __future__ import annotations

import threading
import time

import pytest

from phasechat.backends.base import TokenCount
from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.costs import DraftForecast
from phasechat.chat.turns import TurnController
from phasechat.telemetry.forecast import Forecast


class Counting:
    """The real backend, recording what it was asked to count and on which thread."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.calls: list[tuple[int, str]] = []  # (messages, thread name)

    def __getattr__(self, name: str) -> object:
        return getattr(self.backend, name)

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        self.calls.append((len(messages), threading.current_thread().name))
        return self.backend.count_tokens(messages)


def turns_with_history(backend: object) -> TurnController:
    turns = TurnController(backend, Settings(max_tokens=64))  # type: ignore[arg-type]
    for i in range(6):
        turns.conversation.add(ChatMessage("user", f"Question {i} about lighthouses?"))
        turns.conversation.add(ChatMessage("assistant", f"Answer {i}: " + "light " * 40))
    return turns


def settle(forecasts: DraftForecast, turns: TurnController, draft: str) -> Forecast | None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        forecasts.update(turns, draft)
        if forecasts.of(draft) is not None:
            return forecasts.of(draft)
        time.sleep(0.01)
    raise AssertionError("no forecast")


@pytest.mark.model
def test_the_draft_forecast_counts_as_the_whole_prompt_would(local_backend: LocalBackend) -> None:
    counting = Counting(local_backend)
    turns = turns_with_history(counting)
    forecasts = DraftForecast(every_s=0)
    try:
        drafts = ["How tall", "How tall is the tallest lighthouse", "And its lamp?"]
        for draft in drafts:
            f = settle(forecasts, turns, draft)
            assert f is not None
            whole = (*turns.request().messages, Message("user", draft))
            exact = local_backend.count_tokens(whole).tokens
            assert abs(f.prompt_tokens - exact) <= 2, (f.prompt_tokens, exact)
        history_counts = [n for n, _ in counting.calls if n > 1]
        assert len(history_counts) == 1  # the history once, not per draft
        assert {name for _, name in counting.calls} == {"forecast_0"}  # never this thread
        assert threading.current_thread().name == "MainThread"
    finally:
        forecasts.close()


@pytest.mark.model
def test_a_1mb_paste_is_counted_off_the_calling_thread(local_backend: LocalBackend) -> None:
    counting = Counting(local_backend)
    turns = turns_with_history(counting)
    forecasts = DraftForecast(every_s=0)
    paste = "word " * 200_000
    try:
        t0 = time.perf_counter()
        assert forecasts.update(turns, paste) is None  # returns at once: nothing yet
        returned_s = time.perf_counter() - t0
        f = settle(forecasts, turns, paste)
        counted_s = time.perf_counter() - t0
        assert f is not None and f.prompt_tokens > 200_000
        # Not a timing limit: the call returned before the count it started was done.
        assert returned_s < counted_s
        assert all(name == "forecast_0" for _, name in counting.calls)
    finally:
        forecasts.close()
