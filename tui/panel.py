"""What the telemetry panel and the switch screen say, computed from the session's state.

Kept apart from the app so the app stays about events and layout; nothing here draws.
"""

from __future__ import annotations

from backends.base import Backend
from backends.events import Message
from backends.local import LocalBackend
from chat.profiles import BackendSpec
from chat.session import ChatSession
from telemetry.forecast import Forecast, forecast, measured_rates
from telemetry.metrics import Metrics
from telemetry.tokens import estimate_messages
from tui.telemetry_view import fmt


def history_metrics(session: ChatSession) -> list[Metrics]:
    return [e.metrics for e in session.exchanges if e.metrics is not None]


def draft_forecast(session: ChatSession, draft: str) -> Forecast | None:
    """Predicted cost of sending `draft` now, on the active backend, from its own rates."""
    backend = session.backend
    if backend.state != "ready" or not draft.strip():
        return None
    messages = (*session.request().messages, Message("user", draft))
    if isinstance(backend, LocalBackend):
        total, cached = backend.cached_prefix(messages)
        estimated = False
    else:
        total, estimated = backend.count_tokens(messages).tokens, True
        cached = _remote_cached_guess(session, backend)
    rates = measured_rates(history_metrics(session), backend.name)
    return forecast(rates, total, cached, session.settings.max_tokens, estimated)


def _remote_cached_guess(session: ChatSession, backend: Backend) -> int:
    """A server with a prefix cache holds the last request's prompt and answer."""
    for exchange in reversed(session.exchanges):
        m = exchange.metrics
        if m is not None and m.backend == backend.name:
            if m.cached_tokens is None and m.server_cache_n is None:
                return 0  # never seen this server report a cache: assume none
            return (m.prompt_tokens or 0) + m.output_tokens
    return 0


def switch_cost(session: ChatSession, spec: BackendSpec, instance: Backend | None) -> str:
    """One line: the history's size on the target and its measured re-prefill time."""
    messages = session.request().messages
    if instance is not None and instance.state == "ready":
        count = instance.count_tokens(messages)
        tokens, estimated = count.tokens, count.estimated
    else:
        tokens, estimated = estimate_messages(messages), True
    approx = "~" if estimated else ""
    head = f"history {approx}{tokens:,} tokens"
    if spec.name == session.backend.name:
        return head + " · active"
    rates = measured_rates(history_metrics(session), spec.name)
    if rates.prefill_tok_s is None:
        return head + " · re-prefill time unknown (not measured yet)"
    seconds = rates.overhead_ms / 1000 + tokens / rates.prefill_tok_s
    return f"{head} · re-prefill ≈ {fmt(seconds, ' s', 1)} at {fmt(rates.prefill_tok_s)} tok/s"
