"""Forecasts from a backend's own measured rates:
`ttft ~ overhead + new_prompt_tokens / prefill_tok_s`,
`total ~ ttft + output_tokens / decode_tok_s`.

The prefill line is fitted per backend over its recent answers (least squares of TTFT
against evaluated tokens), so the fixed cost of a request (templating, the network,
queueing, the first batch's set-up) is its own term instead of being folded into the
rate, which would make a 20-token prompt look nearly free. The decode rate is the median
of recent answers, so one outlier (a cold start, a busy machine) does not swing it.
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
    overhead_ms: float = 0.0  # the fixed part of ttft_ms ...
    prefill_ms: float | None = None  # ... and the part that grows with the new tokens

    @property
    def new_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


def measured_rates(history: Iterable[Metrics], backend: str) -> Rates:
    """Median prefill and decode rates of `backend`'s last RECENT finished answers.

    Prefill rates from answers that evaluated only a few tokens are skipped: a
    3-token prefill measures overhead, not throughput.
    """
    mine = [m for m in history if m.backend == backend and m.finish != "error"][-RECENT:]
    decode = [m.decode_tok_s for m in mine if m.decode_tok_s and m.output_tokens >= 4]
    decode_rate = statistics.median(decode) if decode else None
    # Only answers whose evaluated count is known: a server that hides its cache gives
    # no point on the line (its TTFT would be plotted against a guess).
    # TTFT from when the model was ready: a first answer that waited for the load
    # would otherwise price every token with the load's seconds.
    points = [
        (float(m.evaluated_prompt_tokens), m.ttft_ready_ms)
        for m in mine
        if m.evaluated_prompt_tokens is not None and m.ttft_ready_ms is not None
    ]
    line = fit_line(points)
    if line is not None:
        overhead, ms_per_token = line
        return Rates(1000 / ms_per_token, decode_rate, len(mine), overhead)
    # One prompt size so far: the overhead cannot be told apart; rate = tokens / TTFT.
    prefill = [
        m.prefill_tok_s for m in mine if m.prefill_tok_s and (m.evaluated_prompt_tokens or 0) >= 16
    ]
    rate = statistics.median(prefill) if prefill else None
    return Rates(rate, decode_rate, len(mine), 0.0)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares `y = a + b x` over `points`: (a >= 0, b > 0), or None when the points
    cannot say (fewer than two prompt sizes, or TTFT not growing with the prompt)."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    # prompt sizes must differ by a few tokens at least, or the slope is noise
    if sxx < 16 * len(points):
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    if slope <= 0:
        return None
    return max(0.0, my - slope * mx), slope


def forecast(
    rates: Rates, prompt_tokens: int, cached_tokens: int, max_tokens: int, estimated: bool
) -> Forecast:
    """Predicted TTFT and total time for a prompt of `prompt_tokens` (of which
    `cached_tokens` the engine already holds) answered with up to `max_tokens`."""
    new = max(0, prompt_tokens - cached_tokens)
    prefill = new / rates.prefill_tok_s * 1000 if rates.prefill_tok_s else None
    ttft = rates.overhead_ms + prefill if prefill is not None else None
    total = None
    if ttft is not None and rates.decode_tok_s:
        total = ttft + max(0, max_tokens - 1) / rates.decode_tok_s * 1000
    return Forecast(
        prompt_tokens, cached_tokens, max_tokens, ttft, total, estimated, rates.overhead_ms, prefill
    )
