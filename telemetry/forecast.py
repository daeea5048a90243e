"""Forecasts from a backend's own measured rates:
`total ~ new_prompt_tokens / prefill_tok_s + output_tokens / decode_tok_s`.

Rates are the median of the backend's recent answers, so one outlier (a cold start, a
busy machine) does not swing the forecast.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from phasechat.telemetry.metrics import Metrics

RECENT = 8


@dataclass(frozen=True, slots=True)
class Rates:
    """A backend's measured speeds (None until it has been measured)."""

    prefill_tok_s: float | None
    decode_tok_s: float | None
    samples: int
    overhead_ms: float = 0.0  # TTFT not explained by prefill: templating, network, queueing


@dataclass(frozen=True, slots=True)
class Forecast:
    """Predicted time of a request, split by phase."""

    prompt_tokens: int
    cached_tokens: int
    max_tokens: int
    ttft_ms: float | None
    total_ms: float | None  # with max_tokens of output: an upper bound
    estimated_tokens: bool

    @property
    def new_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


def measured_rates(history: Iterable[Metrics], backend: str) -> Rates:
    """Median prefill and decode rates of `backend`'s last RECENT finished answers.

    Prefill rates from answers that evaluated only a few tokens are skipped: a
    3-token prefill measures overhead, not throughput.
    """
    mine = [m for m in history if m.backend == backend and m.finish != "error"][-RECENT:]
    prefill = [
        m.prefill_tok_s for m in mine if m.prefill_tok_s and (m.evaluated_prompt_tokens or 0) >= 16
    ]
    decode = [m.decode_tok_s for m in mine if m.decode_tok_s and m.output_tokens >= 4]
    rate = statistics.median(prefill) if prefill else None
    overhead = 0.0
    if rate:
        rest = [
            m.ttft_ms - (m.evaluated_prompt_tokens or 0) / rate * 1000
            for m in mine
            if m.ttft_ms is not None
        ]
        overhead = max(0.0, statistics.median(rest)) if rest else 0.0
    return Rates(rate, statistics.median(decode) if decode else None, len(mine), overhead)


def forecast(
    rates: Rates, prompt_tokens: int, cached_tokens: int, max_tokens: int, estimated: bool
) -> Forecast:
    """Predicted TTFT and total time for a prompt of `prompt_tokens` (of which
    `cached_tokens` the engine already holds) answered with up to `max_tokens`."""
    new = max(0, prompt_tokens - cached_tokens)
    ttft = rates.overhead_ms + new / rates.prefill_tok_s * 1000 if rates.prefill_tok_s else None
    total = None
    if ttft is not None and rates.decode_tok_s:
        total = ttft + max(0, max_tokens - 1) / rates.decode_tok_s * 1000
    return Forecast(prompt_tokens, cached_tokens, max_tokens, ttft, total, estimated)
