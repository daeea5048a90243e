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

Repeats: one run of a level is one draw of a noisy quantity (on a real vLLM the
aggregate at 2 streams read 40.7 to 49.0 tok/s across three runs, and one draw made
2 -> 4 streams "grow 110% per doubling"). So a level is run several times and read as
the median of its repeats with their spread (`RepeatSpread`); a step between two levels
(`LevelStep`) is believed only when it is wider than that spread, and a growth above
MAX_GROWTH per doubling is flagged as impossible, never reported as a finding.
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

#: A doubling of concurrent streams can at most double aggregate throughput (no stream
#: runs faster for having company), and only on a perfect server: growth above this per
#: doubling is measurement noise.
MAX_GROWTH = 1.0


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


def growth(low_c: int, low_rate: float, high_c: int, high_rate: float) -> float | None:
    """A rate's growth from concurrency `low_c` to `high_c`, scaled to one doubling of
    concurrency (1 -> 4 that doubles it is +41% per doubling). None when the low rate is
    nothing or the levels are not increasing."""
    if low_rate <= 0 or high_c <= low_c:
        return None
    ratio: float = (high_rate / low_rate) ** (1 / math.log2(high_c / low_c))
    return ratio - 1


def growth_per_doubling(low: Level, high: Level) -> float | None:
    """Aggregate output throughput's growth from one run of `low` to one of `high`, per
    doubling of concurrency (see `growth`)."""
    return growth(low.concurrency, low.output_throughput, high.concurrency, high.output_throughput)


@dataclass(frozen=True, slots=True)
class RepeatSpread:
    """One level's aggregate output tok/s over its repeats: the median, and p10-p90.

    p10-p90 (linear, numpy's) rather than min-max: with more repeats an outlier weighs
    less in it, so a repeat can narrow it; min-max only ever widens as repeats come in,
    and repeating a noisy level could never settle it. One repeat has no spread (0).
    A comparison's spread (chat/trips/compare.Spread) is min-max below 10 runs instead:
    it decides nothing, and with its few runs min-max shows each run's reach."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a spread needs at least one repeat")

    @property
    def median(self) -> float:
        return percentile(sorted(self.values), 50)

    @property
    def p10(self) -> float:
        return percentile(sorted(self.values), 10)

    @property
    def p90(self) -> float:
        return percentile(sorted(self.values), 90)

    @property
    def width(self) -> float:
        return self.p90 - self.p10


@dataclass(frozen=True, slots=True)
class LevelStep:
    """From one level to the next (`low` < `high` concurrency), read from the medians of
    their repeats, with their spreads."""

    low: int
    high: int
    low_spread: RepeatSpread
    high_spread: RepeatSpread

    @property
    def change(self) -> float:
        """The step: the high level's median minus the low one's (tok/s; < 0 = fell)."""
        return self.high_spread.median - self.low_spread.median

    @property
    def growth(self) -> float | None:
        """The medians' growth per doubling of concurrency (see `growth`)."""
        return growth(self.low, self.low_spread.median, self.high, self.high_spread.median)

    @property
    def impossible(self) -> bool:
        """More than doubled per doubling: noise, not a server's behaviour."""
        return self.growth is not None and self.growth > MAX_GROWTH

    @property
    def high_noisy(self) -> bool:
        """The high level's spread is wider than the step up to it: that level is not
        yet measured well enough to tell the step from noise."""
        return self.high_spread.width > abs(self.change)

    @property
    def noise(self) -> float:
        """The wider spread of the two ends (tok/s)."""
        return max(self.low_spread.width, self.high_spread.width)

    @property
    def inside_noise(self) -> bool:
        """Either end's spread is wider than the step: its size is not known, nor
        whether it is past the knee."""
        return self.noise > abs(self.change)


def needs_repeat(step: LevelStep) -> bool:
    """Should the high level of `step` (the one just measured) be run once more? When its
    spread is wider than the step up to it, or the step grew impossibly."""
    return step.high_noisy or step.impossible


def steps(points: Sequence[tuple[int, RepeatSpread]]) -> list[LevelStep]:
    """Every step between consecutive levels of `points` ((concurrency, spread) pairs),
    in increasing concurrency."""
    ordered = sorted(points, key=lambda p: p[0])
    return [LevelStep(lo, hi, s_lo, s_hi) for (lo, s_lo), (hi, s_hi) in itertools.pairwise(ordered)]


@dataclass(frozen=True, slots=True)
class KneeReading:
    """Where the knee is, or why none is claimed."""

    #: the knee's concurrency; None when not reached or not claimed
    concurrency: int | None
    #: the first step whose median growth is below the threshold but that sits inside
    #: the noise: the knee may be there, and no knee is claimed
    unclear: LevelStep | None = None


def read_knee(sweep_steps: Sequence[LevelStep], threshold: float = KNEE_GROWTH) -> KneeReading:
    """The knee from the medians with their spreads: the lower level of the first step
    whose median growth per doubling is below `threshold`, claimed only when that step is
    wider than the noise of both its levels (else `unclear` names it, and no later step
    is claimed either: the knee may be at the unclear one)."""
    for step in sweep_steps:
        rate = step.growth
        if rate is None or rate >= threshold:
            continue
        if step.inside_noise:
            return KneeReading(None, step)
        return KneeReading(step.low)
    return KneeReading(None)


def knee(levels: Sequence[Level], threshold: float = KNEE_GROWTH) -> int | None:
    """The knee of levels measured once each (no spread: every step is believed)."""
    points = [(lv.concurrency, RepeatSpread((lv.output_throughput,))) for lv in levels]
    return read_knee(steps(points), threshold).concurrency


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
