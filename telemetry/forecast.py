"""Forecasts from a backend's own measured rates:
`ttft ~ overhead + prefill(new tokens after the cached ones)`,
`total ~ ttft + output_tokens / decode_tok_s`.

The prefill is fitted per backend over its recent answers. Where the engine gives its
own account of each prefill (llama.cpp's counters, llama-server's `timings`, vLLM's
/metrics), its prompt time is fitted by least squares as a cost per new token plus a
cost per new token per cached token before it (`attention_ms`: a short turn late in a
long chat reads the whole cache for each of its tokens, so it costs more a token than
the same chat read again from its start), plus, once a long read has shown it, a cost
per new token per new token before it in the same read (`batch_attention_ms`). The two
attention terms are kept apart because they differ: measured on the bundled model
(`bench.prefill_grid`, 2 threads, quiet), 12-24 new tokens after 512 cached cost 3.1-4.7
µs a token per cached token, while one long read costs 1.1-1.3 µs a token per token
before it (3.79 ms a token for 512 tokens from nothing, 5.14 for 3,072): one big batch
reads the keys and values once for all its queries. Priced at the short turns' rate, a
615-token re-read was forecast 26% high (the grid's own reads) and 25-36% high in
`bench.edit_forecast`; in a chat of short turns the long-read term cannot be fitted and is 0,
so a read far longer than any seen is forecast low (a 3,072-token read about 24%).
The fixed cost of a request (templating, the network, queueing) is measured, not
fitted: the median of TTFT less the engine's prompt time. Least squares on times weights
each answer by the tokens it read, so one long read outweighs many short turns.

Without the engine's account, TTFT is fitted against the evaluated tokens (a fixed cost
and a cost per token), which needs prompts of different sizes; with one size only, the
rate is the median of TTFT / tokens. The decode rate is the median of recent answers, so
one outlier (a cold start, a busy machine) does not swing it. TTFT here is counted from
when the model was ready (`Metrics.ttft_ready_ms`): a first answer that waited for the
load says nothing of prefill.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from phasechat.telemetry.metrics import Metrics

RECENT = 8


@dataclass(frozen=True, slots=True)
class Rates:
    """A backend's measured speeds (None until it has been measured)."""

    prefill_tok_s: float | None
    decode_tok_s: float | None
    samples: int
    overhead_ms: float = 0.0  # TTFT not explained by prefill: templating, network, queueing
    #: the prefill's cost of a new token for each cached token before it, in ms (attention)
    attention_ms: float = 0.0
    #: ... and for each new token before it in the same read (0 until a long read shows it)
    batch_attention_ms: float = 0.0

    def prefill_ms(self, new: int, cached: int) -> float | None:
        """The prefill of `new` tokens after `cached` ones (None: not measured): each new
        token's own cost, its attention to the cached tokens, and to the new ones before
        it (priced once a long read has shown it: module docstring)."""
        if not self.prefill_tok_s:
            return None
        if new <= 0:
            return 0.0
        within = self.batch_attention_ms * new * (new + 1) / 2
        return new * 1000 / self.prefill_tok_s + self.attention_ms * new * cached + within


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
    # The engine's own account: its prompt time (a wait for the model to load is in
    # neither it nor `ttft_ready_ms`) and the tokens it read after the cached ones.
    engine = [
        (m.server_prompt_n, _cached(m), m.server_prompt_ms, m.ttft_ready_ms)
        for m in mine
        if m.server_prompt_n
        and m.server_prompt_ms
        and m.ttft_ready_ms is not None
        and m.server_prompt_ms <= m.ttft_ready_ms
    ]
    fitted = fit_prefill([(n, cached, ms) for n, cached, ms, _ in engine])
    if fitted is not None:
        ms_per_token, attention, within = fitted
        overhead = statistics.median(ttft - ms for _, _, ms, ttft in engine)
        return Rates(1000 / ms_per_token, decode_rate, len(mine), overhead, attention, within)
    # Only answers whose evaluated count is known: a server that hides its cache gives
    # no point on the line (its TTFT would be plotted against a guess). TTFT from when
    # the model was ready: a first answer that waited for the load would otherwise
    # price every token with the load's seconds.
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


def _cached(m: Metrics) -> int:
    """The tokens before the engine's prefill: its own count, else ours."""
    return m.server_cache_n if m.server_cache_n is not None else (m.cached_tokens or 0)


#: How far apart the regressors of the prefill fit must be for a term to be fitted: the
#: determinant of their correlation matrix (for two, 1 - cos² of the angle between them).
#: At one depth a token's cost and its attention to the cache cannot be told apart.
DEPTHS_APART = 0.05
#: The new tokens' attention among themselves is fitted only once a read this long (and
#: 4 times the median read) shows it: in short turns it is too small to tell from noise.
LONG_READ = 128


def fit_prefill(points: list[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    """Least squares `ms = c n + k n cached + b n (n + 1) / 2` over (new tokens n, cached,
    ms) points: (c > 0 ms a token, k >= 0 ms a token per cached token, b >= 0 ms a token
    per new token before it in the read). c and k come from the reads shorter than a long
    one (`LONG_READ`, and 4 times the median), k only where their depths differ
    (`DEPTHS_APART`); b from what the long reads took beyond that (0 without one), the
    two refined in turn. A term that cannot be told, or that comes out negative, is 0.
    None without a point, or with no time."""
    rows = [(float(n), float(n * cached), n * (n + 1) / 2, ms) for n, cached, ms in points if n > 0]
    if not rows:
        return None
    median = statistics.median(r[0] for r in rows)
    long = [r for r in rows if r[0] >= LONG_READ and r[0] >= 4 * median]
    short = [r for r in rows if r not in long] if long else rows
    b = 0.0
    for _ in range(ROUNDS if long and short else 1):
        fitted = _fit_short([(n, nd, ms - b * w) for n, nd, w, ms in short])
        if fitted is None:
            return None
        c, k = fitted
        if long:
            # what each long read took beyond its tokens and their attention to the cache
            rest = [(w, ms - c * n - k * nd) for n, nd, w, ms in long]
            b = max(0.0, sum(w * y for w, y in rest) / sum(w * w for w, _ in rest))
    return c, k, b


#: rounds of fitting (c, k) and b in turn: each round moves them less than the last
ROUNDS = 4


def _fit_short(rows: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(c, k) of `ms = c n + k n cached` over (n, n cached, ms) rows; k = 0 where the
    depths are too alike to tell or the fit makes it negative."""
    for cols in ((0, 1), (0,)):
        coef = _least_squares([[r[i] for i in cols] for r in rows], [r[2] for r in rows])
        if coef is not None and coef[0] > 0 and all(v >= 0 for v in coef):
            return coef[0], (coef[1] if len(coef) > 1 else 0.0)
    return None


def _least_squares(x: list[list[float]], y: list[float]) -> list[float] | None:
    """The least-squares coefficients of `y` on the columns of `x` (no intercept: a
    prefill of no tokens takes no time), by the normal equations; None where the columns
    are too alike to tell apart (`DEPTHS_APART`) or one is all zero."""
    a, v = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    gram = a.T @ a
    scale = np.sqrt(np.diag(gram))
    if not np.all(scale > 0):
        return None
    if a.shape[1] > 1 and np.linalg.det(gram / np.outer(scale, scale)) <= DEPTHS_APART:
        return None
    return [float(c) for c in np.linalg.solve(gram, a.T @ v)]


def forecast(
    rates: Rates, prompt_tokens: int, cached_tokens: int, max_tokens: int, estimated: bool
) -> Forecast:
    """Predicted TTFT and total time for a prompt of `prompt_tokens` (of which
    `cached_tokens` the engine already holds) answered with up to `max_tokens`."""
    new = max(0, prompt_tokens - cached_tokens)
    prefill = rates.prefill_ms(new, min(cached_tokens, prompt_tokens))
    ttft = rates.overhead_ms + prefill if prefill is not None else None
    total = None
    if ttft is not None and rates.decode_tok_s:
        total = ttft + max(0, max_tokens - 1) / rates.decode_tok_s * 1000
    return Forecast(
        prompt_tokens, cached_tokens, max_tokens, ttft, total, estimated, rates.overhead_ms, prefill
    )
