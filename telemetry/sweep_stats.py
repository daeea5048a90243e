"""The arithmetic of a concurrency sweep: per-level statistics, goodput and the knee.

Pure: numbers in, numbers out. `chat/sweep.py` measures the requests; this module
reduces them. Field names follow vLLM's `vllm bench serve` result JSON
(vllm-project/vllm `vllm/benchmarks/serve.py`: `BenchmarkMetrics`, `calculate_metrics`
and the `result` dict: `completed`, `failed`, `total_input_tokens`,
`total_output_tokens`, `request_throughput`, `request_goodput`, `output_throughput`,
`total_token_throughput`, `mean_/median_/std_/p99_ttft_ms`, the same for `tpot`, `itl`
and `e2el`, `max_concurrency`), with vLLM's definitions:

- TPOT of one request = (e2e latency - TTFT) / (output tokens - 1), first token
  excluded; a request of one token has no TPOT (its TPOT counts as 0 for goodput).
- ITL = every gap between consecutive streamed chunks, pooled over all requests.
- goodput = requests that met every SLO given / the level's duration (req/s); None
  when no SLO is given (vLLM writes null then too).
- percentiles: linear interpolation, numpy's default (as vLLM's `np.percentile`).

TTFT p50 / p99 are `median_ttft_ms` / `p99_ttft_ms`. Added beside vLLM's fields:
`per_user_decode_tok_s`, the median over requests of each one's own decode rate (what
one user sees while the others share the server).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phasechat.telemetry.metrics import percentile

#: A doubling of concurrency that raises aggregate output throughput by less than this
#: share is past the knee: more concurrent users now mostly share the same throughput.
KNEE_GROWTH = 0.10


@dataclass(frozen=True, slots=True)
class Sample:
    """One request of a sweep, as measured (None where not measured)."""

    ttft_ms: float | None
    e2e_ms: float | None
    output_tokens: int
    prompt_tokens: int | None
    decode_tok_s: float | None
    itl_ms: tuple[float, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_ms is not None and self.e2e_ms is not None

    @property
    def tpot_ms(self) -> float | None:
        """vLLM's TPOT: (e2e - TTFT) / (tokens - 1); None for fewer than two tokens."""
        if not self.ok or self.output_tokens <= 1:
            return None
        assert self.e2e_ms is not None and self.ttft_ms is not None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives for goodput, in ms; None = not required."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @property
    def given(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def met(self, s: Sample) -> bool:
        """Did `s` meet every objective given? (A failed request never does.)"""
        if not s.ok:
            return False
        assert s.ttft_ms is not None
        if self.ttft_ms is not None and s.ttft_ms > self.ttft_ms:
            return False
        # as vLLM: a one-token answer's TPOT counts as 0
        return self.tpot_ms is None or (s.tpot_ms or 0.0) <= self.tpot_ms


@dataclass(frozen=True, slots=True)
class Level:
    """The figures of one concurrency level."""

    concurrency: int
    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    per_user_decode_tok_s: float | None
    ttft: dict[str, float | None]
    tpot: dict[str, float | None]
    itl: dict[str, float | None]
    e2el: dict[str, float | None]

    def record(self) -> dict[str, Any]:
        """vLLM's result fields for this level (`max_concurrency` names the level)."""
        out: dict[str, Any] = {
            "max_concurrency": self.concurrency,
            "duration": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "per_user_decode_tok_s": self.per_user_decode_tok_s,
        }
        for name, stats in (
            ("ttft", self.ttft),
            ("tpot", self.tpot),
            ("itl", self.itl),
            ("e2el", self.e2el),
        ):
            for stat, value in stats.items():
                out[f"{stat}_{name}_ms"] = value
        return out


def summarize(values: Sequence[float]) -> dict[str, float | None]:
    """mean, median, std (population, as numpy's) and p99 of `values`; None when empty."""
    if not values:
        return {"mean": None, "median": None, "std": None, "p99": None}
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "median": percentile(ordered, 50),
        "std": statistics.pstdev(ordered),
        "p99": percentile(ordered, 99),
    }


def level(concurrency: int, samples: Sequence[Sample], duration_s: float, slo: Slo) -> Level:
    """Reduce one level's requests, run at `concurrency` for `duration_s` seconds."""
    if duration_s <= 0:
        raise ValueError("a level's duration must be positive")
    ok = [s for s in samples if s.ok]
    tokens_in = sum(s.prompt_tokens or 0 for s in ok)
    tokens_out = sum(s.output_tokens for s in ok)
    rates = sorted(s.decode_tok_s for s in ok if s.decode_tok_s)
    good = sum(slo.met(s) for s in samples) if slo.given else None
    return Level(
        concurrency=concurrency,
        duration_s=duration_s,
        completed=len(ok),
        failed=len(samples) - len(ok),
        total_input_tokens=tokens_in,
        total_output_tokens=tokens_out,
        request_throughput=len(ok) / duration_s,
        request_goodput=good / duration_s if good is not None else None,
        output_throughput=tokens_out / duration_s,
        total_token_throughput=(tokens_in + tokens_out) / duration_s,
        per_user_decode_tok_s=percentile(rates, 50) if rates else None,
        ttft=summarize([s.ttft_ms for s in ok if s.ttft_ms is not None]),
        tpot=summarize([t for s in ok if (t := s.tpot_ms) is not None]),
        itl=summarize([gap for s in ok for gap in s.itl_ms]),
        e2el=summarize([s.e2e_ms for s in ok if s.e2e_ms is not None]),
    )


def growth_per_doubling(low: Level, high: Level) -> float | None:
    """Aggregate output throughput's growth from `low` to `high`, scaled to one doubling
    of concurrency (1 -> 4 that doubles throughput is +41% per doubling). None when
    `low` produced nothing or the levels are not increasing."""
    if low.output_throughput <= 0 or high.concurrency <= low.concurrency:
        return None
    doublings = math.log2(high.concurrency / low.concurrency)
    ratio: float = (high.output_throughput / low.output_throughput) ** (1 / doublings)
    return ratio - 1


def knee(levels: Sequence[Level], threshold: float = KNEE_GROWTH) -> int | None:
    """The concurrency past which aggregate throughput stops paying: the lower level of
    the first step (levels in increasing concurrency) whose growth per doubling is below
    `threshold`. None when every step still grows by more (no knee within the sweep)."""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    for low, high in itertools.pairwise(ordered):
        growth = growth_per_doubling(low, high)
        if growth is not None and growth < threshold:
            return low.concurrency
    return None


def parse_levels(text: str) -> tuple[int, ...]:
    """`"1,2,4,8"` -> (1, 2, 4, 8): distinct positive integers, increasing. ValueError
    with one line otherwise."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sweep expects integers like 1,2,4,8, not {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError("--sweep levels must be 1 or more")
    if sorted(set(values)) != values:
        raise ValueError("--sweep levels must increase, each once (e.g. 1,2,4,8)")
    return tuple(values)
