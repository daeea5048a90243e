"""What a send or a backend switch would cost, from the session's own measurements.

The UI formats these; nothing here draws. Rates are each backend's own medians
(telemetry/forecast.py), so a switch preview never prices one engine with another's speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from phasechat.backends.base import Backend, PromptRefused
from phasechat.backends.events import Message
from phasechat.backends.tokens import estimate_messages
from phasechat.chat.turns import TurnController
from phasechat.telemetry.forecast import Forecast, Rates, forecast, measured_rates
from phasechat.telemetry.metrics import Metrics

K = TypeVar("K")
V = TypeVar("V")


def history_metrics(turns: TurnController) -> list[Metrics]:
    """The metrics of every finished answer of the session, oldest first; in a chat
    opened from disk, its saved answers' come first (a fresh `ask --chat` has no other)."""
    ran = [e.metrics for e in turns.exchanges if e.metrics is not None]
    seen = {id(m) for m in ran}
    saved = [
        m.metrics
        for m in turns.conversation.every()
        if m.metrics is not None and id(m.metrics) not in seen
    ]
    return saved + ran


class _Latest(Generic[K, V]):
    """A value computed in a worker thread for a key that keeps changing (a draft as it
    is typed): `_poll` never waits: it returns the last value and starts a computation
    for a new key (at most every `every_s`), which the next poll collects."""

    def __init__(self, every_s: float, name: str) -> None:
        self.every_s = every_s
        self._key: K | None = None
        self._value: V | None = None
        self._at = 0.0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._job: Future[V | None] | None = None
        self._job_key: K | None = None

    def _poll(self, key: K, start: Callable[[K], Callable[[], V | None] | None]) -> V | None:
        """The last value; `start(key)` gives the work for a new key (None: no value)."""
        job = self._job
        if job is not None and job.done():
            self._job = None
            self._key, self._value = self._job_key, job.result()
        now = time.monotonic()
        if self._job is None and key != self._key and now - self._at >= self.every_s:
            self._at = now
            work = start(key)
            if work is None:
                self._key, self._value = key, None
            else:
                self._job_key, self._job = key, self._pool.submit(work)
        return self._value

    def _for(self, key: K) -> V | None:
        """The value computed for exactly `key`, if it is the last one."""
        return self._value if self._key == key else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class DraftForecast(_Latest[str, Forecast]):
    """The forecast of a draft as it is typed, off the UI thread and at a cost that does
    not grow with the chat.

    The prompt is the history plus the draft; the history's tokens are counted once per
    history (a 32k-token chat is not re-tokenized per keystroke), the draft's alone, in a
    worker thread (a 1 MB paste is tokenized there, not where keys are handled). `update`
    never waits: it returns the last forecast and starts a new one when the draft
    changed (at most every `every_s`).
    """

    def __init__(self, every_s: float = 0.25) -> None:
        super().__init__(every_s, "forecast")
        # (key, tokens of the history + an empty user turn, of them already in the cache)
        self._history: tuple[object, int, int | None] = (None, 0, None)
        self._empty: tuple[str, int] = ("", 0)  # (backend, tokens of an empty user turn)

    def update(self, turns: TurnController, draft: str) -> Forecast | None:
        """The forecast for `draft` (the last one computed, while a newer one runs)."""
        return self._poll(draft, lambda d: self._work(turns, d))

    def of(self, draft: str) -> Forecast | None:
        """The forecast made for exactly `draft`, if it is the last one computed."""
        return self._for(draft)

    def _work(self, turns: TurnController, draft: str) -> Callable[[], Forecast | None] | None:
        backend = turns.backend
        if backend.state != "ready" or not draft.strip():
            return None
        history = turns.request().messages
        tail = history[-1].content[-64:] if history else ""
        key = (backend.name, len(history), sum(len(m.content) for m in history), tail)
        rates = measured_rates(history_metrics(turns), backend.name)
        guess = _remote_cached_guess(turns, backend)
        max_tokens = turns.settings.max_tokens

        def work() -> Forecast | None:
            try:
                if self._history[0] != key:
                    empty = (*history, Message("user", ""))
                    count = backend.count_tokens(empty).tokens
                    self._history = (key, count, backend.cached_prefix(empty))
                if self._empty[0] != backend.name:
                    blank = backend.count_tokens((Message("user", ""),)).tokens
                    self._empty = (backend.name, blank)
                alone = backend.count_tokens((Message("user", draft),))
            except PromptRefused:
                return None  # the template refuses this history: the send will say so
            tokens = self._history[1] + alone.tokens - self._empty[1]
            cached = self._history[2]
            if cached is None:
                cached = guess
            return forecast(rates, tokens, min(cached, tokens), max_tokens, alone.estimated)

        return work


def _remote_cached_guess(turns: TurnController, backend: Backend) -> int:
    """A server with a prefix cache holds the last request's prompt and answer."""
    for exchange in reversed(turns.exchanges):
        m = exchange.metrics
        if m is not None and m.backend == backend.name:
            if m.cached_tokens is None and m.server_cache_n is None:
                return 0  # never seen this server report a cache: assume none
            # The thinking is in the server's cache but not in the next prompt, so the
            # shared prefix ends where the thinking began.
            return (m.prompt_tokens or 0) + (0 if m.reasoning_tokens else m.output_tokens)
    return 0


@dataclass(frozen=True, slots=True)
class SwitchCost:
    """The history's size on a switch target and, once measured there, its re-prefill."""

    tokens: int
    estimated: bool
    active: bool
    rates: Rates

    @property
    def reprefill_s(self) -> float | None:
        """Seconds to read the whole history again on the target (None: not measured)."""
        prefill = self.rates.prefill_ms(self.tokens, 0)
        if prefill is None:
            return None
        return (self.rates.overhead_ms + prefill) / 1000


def switch_cost(turns: TurnController, name: str, instance: Backend | None) -> SwitchCost:
    """What switching to profile `name` (its backend, if already built) would cost."""
    messages = turns.request().messages
    if instance is not None and instance.state == "ready":
        count = instance.count_tokens(messages)
        tokens, estimated = count.tokens, count.estimated
    else:
        tokens, estimated = estimate_messages(messages), True
    rates = measured_rates(history_metrics(turns), name)
    return SwitchCost(tokens, estimated, name == turns.backend.name, rates)


@dataclass(frozen=True, slots=True)
class Expected:
    """What a send would cost, before it is sent: its prompt, how much of it the engine
    holds, and the TTFT that implies at this backend's measured rates."""

    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float | None
    #: the counts are estimates (not the engine's own tokenizer, or a guess of its cache)
    estimated: bool
    #: the TTFT of this backend's last answer, to set beside it
    last_ttft_ms: float | None

    @property
    def evaluated_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def line(self) -> str:
        """ "keeps 1,204 cached, reads 3,112 again: TTFT about 6.3 s (the last turn: 0.2 s)" """
        approx = "~" if self.estimated else ""
        head = (
            f"keeps {approx}{self.cached_tokens:,} cached, reads {approx}"
            f"{self.evaluated_tokens:,} again"
        )
        if self.cached_tokens == 0:
            head = f"reads all {approx}{self.prompt_tokens:,} tokens again"
        if self.ttft_ms is None:
            return head + " (TTFT: not measured on this backend yet)"
        last = f" (the last turn: {self.last_ttft_ms / 1000:,.1f} s)" if self.last_ttft_ms else ""
        return f"{head}: TTFT about {self.ttft_ms / 1000:,.1f} s{last}"


def expect(
    turns: TurnController,
    messages: tuple[Message, ...],
    exact: tuple[int, int] | None = None,
) -> Expected:
    """What sending `messages` (a `TurnController.preview`) would cost on the active
    backend. `exact`: the prompt's tokens and the prefix the engine holds, where the
    caller counted them with the engine's own template and tokenizer (`held_prefix`, on
    llama-server). Else the local engine's own count and KV cache (exact), or a count
    estimated and a cache guessed from the text the engine was last sent."""
    backend = turns.backend
    cached: int | None
    if exact is not None:
        tokens, cached, estimated = exact[0], exact[1], False
    else:
        count = backend.count_tokens(messages)
        tokens, estimated = count.tokens, count.estimated
        cached = backend.cached_prefix(messages)
    if cached is None:
        cached, estimated = _text_prefix_guess(turns, backend, messages), True
    cached = min(cached, max(0, tokens - 1))  # a prompt held whole re-reads its last token
    history = history_metrics(turns)
    rates = measured_rates(history, backend.name)
    predicted = forecast(rates, tokens, cached, turns.settings.max_tokens, estimated)
    mine = [m for m in history if m.backend == backend.name and m.ttft_ready_ms is not None]
    return Expected(
        tokens, cached, predicted.ttft_ms, estimated, mine[-1].ttft_ready_ms if mine else None
    )


def _text_prefix_guess(
    turns: TurnController, backend: Backend, messages: tuple[Message, ...]
) -> int:
    """Tokens of `messages` a server with a prefix cache still holds, guessed from the
    text of the chat's last request there: the messages they share whole, counted."""
    if _remote_cached_guess(turns, backend) == 0:
        return 0  # never seen this server report a cache
    last = turns.last_request()
    if last is None:
        return 0
    held = (*last[0], Message("assistant", last[1]))
    shared = 0
    for a, b in zip(held, messages, strict=False):
        if a != b:
            break
        shared += 1
    if shared == 0:
        return 0
    return backend.count_tokens(messages[:shared]).tokens


async def held_prefix(
    turns: TurnController, messages: tuple[Message, ...]
) -> tuple[int, int] | None:
    """The tokens of `messages` and how many of them llama-server still holds from this
    chat's last request (its prompt and answer), by its own template and tokenizer;
    None where the backend counts them itself (the local model: `expect` reads its KV
    cache) or cannot render prompts (then `expect` estimates)."""
    backend = turns.backend
    if backend.exact_token_counts:
        return None
    last = turns.last_request()
    new = await backend.render(messages)
    if new is None:
        return None
    if last is None:
        return len(new.pieces), 0
    held = await backend.render((*last[0], Message("assistant", last[1])))
    if held is None:
        return None
    shared = 0
    for a, b in zip(held.pieces, new.pieces, strict=False):
        if a != b:
            break
        shared += 1
    return len(new.pieces), shared


class EditForecast(_Latest[tuple[int, str], Expected]):
    """The cost of an edit as it is typed: `expect` of the branch it would make, off the
    UI thread. `update` never waits: it returns the last forecast and starts a new one
    when the draft changed (at most every `every_s`). On llama-server the engine's own
    template and tokenizer count it (the HTTP calls run on the UI's event loop)."""

    def __init__(self, every_s: float = 0.25) -> None:
        super().__init__(every_s, "edit-forecast")

    def update(self, turns: TurnController, draft: str, edit: int) -> Expected | None:
        """The forecast of `draft` instead of message `edit` (the last one computed for
        that message, while a newer one runs); call it on the event loop."""
        value = self._poll((edit, draft), lambda key: self._work(turns, key))
        return value if self._key is not None and self._key[0] == edit else None

    def of(self, edit: int, draft: str) -> Expected | None:
        """The forecast made for exactly `draft` instead of `edit`, if it is the last."""
        return self._for((edit, draft))

    def _work(
        self, turns: TurnController, key: tuple[int, str]
    ) -> Callable[[], Expected | None] | None:
        if turns.backend.state != "ready":
            return None
        messages = turns.preview(key[1], key[0])
        loop = asyncio.get_running_loop()

        def work() -> Expected | None:
            try:
                held = held_prefix(turns, messages)
                exact = asyncio.run_coroutine_threadsafe(held, loop).result(timeout=10)
                return expect(turns, messages, exact)
            except (PromptRefused, TimeoutError):
                return None  # the send will say why

        return work
