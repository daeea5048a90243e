"""What a send or a backend switch would cost, from the session's own measurements.

The UI formats these; nothing here draws. Rates are each backend's own medians
(telemetry/forecast.py), so a switch preview never prices one engine with another's speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.backends.tokens import estimate_messages
from phasechat.chat.session import ChatSession
from phasechat.telemetry.forecast import Forecast, Rates, forecast, measured_rates
from phasechat.telemetry.metrics import Metrics


def history_metrics(session: ChatSession) -> list[Metrics]:
    """The metrics of every finished answer of the session, oldest first."""
    return [e.metrics for e in session.exchanges if e.metrics is not None]


def draft_forecast(session: ChatSession, draft: str) -> Forecast | None:
    """Predicted cost of sending `draft` now, on the active backend, from its own rates."""
    backend = session.backend
    if backend.state != "ready" or not draft.strip():
        return None
    messages = (*session.request().messages, Message("user", draft))
    count = backend.count_tokens(messages)
    cached = backend.cached_prefix(messages)
    if cached is None:
        cached = _remote_cached_guess(session, backend)
    rates = measured_rates(history_metrics(session), backend.name)
    return forecast(rates, count.tokens, cached, session.settings.max_tokens, count.estimated)


class DraftForecast:
    """The forecast of a draft as it is typed, recomputed at most every `every_s` and only
    when the draft changed (counting a long history's tokens is not free)."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s = every_s
        self._draft, self._at = "", 0.0
        self._forecast: Forecast | None = None

    def update(self, session: ChatSession, draft: str) -> Forecast | None:
        """The forecast for `draft` (the last one computed, while it is fresh)."""
        now = time.monotonic()
        if draft != self._draft and now - self._at >= self.every_s:
            self._draft, self._forecast, self._at = draft, draft_forecast(session, draft), now
        return self._forecast

    def of(self, draft: str) -> Forecast | None:
        """The forecast made for exactly `draft`, if it is the last one computed."""
        return self._forecast if draft == self._draft else None


def _remote_cached_guess(session: ChatSession, backend: Backend) -> int:
    """A server with a prefix cache holds the last request's prompt and answer."""
    for exchange in reversed(session.exchanges):
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
        if self.rates.prefill_tok_s is None:
            return None
        return self.rates.overhead_ms / 1000 + self.tokens / self.rates.prefill_tok_s


def switch_cost(session: ChatSession, name: str, instance: Backend | None) -> SwitchCost:
    """What switching to profile `name` (its backend, if already built) would cost."""
    messages = session.request().messages
    if instance is not None and instance.state == "ready":
        count = instance.count_tokens(messages)
        tokens, estimated = count.tokens, count.estimated
    else:
        tokens, estimated = estimate_messages(messages), True
    rates = measured_rates(history_metrics(session), name)
    return SwitchCost(tokens, estimated, name == session.backend.name, rates)
