"""A concurrency sweep of a remote backend: the server's batching curve, measured.

At each level c, c streams run at once, each sending `per_stream` one-turn requests one
after another (a closed loop: a stream sends its next request when its answer ends, as
vLLM's `--max-concurrency` does). The level's duration is from its first send to its
last answer; `telemetry/sweep_stats.py` reduces the requests to throughput, latency
percentiles, goodput and the knee.

Each level is run `repeats` times (one after another) and read as the median of the
repeats' aggregate output throughput with its p10-p90 spread. A level whose spread is
wider than the step from the level before (or whose step more than doubled throughput
per doubling) is run again, up to `max_repeats` in all; still wide, it is flagged, and
no knee is claimed from a step inside the noise.

Prompts: every request's prompt starts with its own tag (level, stream, request, then a
random id of this sweep) before the task, and no system prompt is sent, so the only
prefix two requests share is the chat template's own opening (with any default system
prompt it adds): an engine's prefix cache cannot make a level cheap by reusing another
request's prompt, nor one from an earlier sweep of the same server. Before the first
level one request warms the server (its first request pays for loading and graph
building); it is in no figure, and the result names it (a server's own counter counts
it: one more than the table's requests).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from phasechat.backends.base import Backend
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.metrics import Metrics, itl_ms
from phasechat.telemetry.sweep_stats import (
    KneeReading,
    Level,
    LevelStep,
    RepeatSpread,
    Sample,
    Slo,
    level,
    needs_repeat,
    read_knee,
    steps,
)

#: What the requests ask for: varied, each inviting an answer longer than max_tokens.
TASKS = (
    "Describe, step by step, how a bicycle gear train changes the effort of pedalling.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how bread rises, from the yeast to the oven, for a curious child.",
    "List the planets of the solar system and tell one surprising fact about each.",
    "Explain why the sea is salty and rivers are not, in plain words.",
    "Write a letter from a cat to its owner about the new dog in the house.",
    "Describe a walk through a busy market at dawn, using all five senses.",
    "Explain how a refrigerator keeps food cold, and where the heat goes.",
)

DEFAULT_PER_STREAM = 2
DEFAULT_MAX_TOKENS = 64
#: runs of each level (the sweep takes this many times as long as one run of it)
DEFAULT_REPEATS = 3
#: a noisy level is run up to this many more times than `repeats`
EXTRA_REPEATS = 2


def prompt_for(run: str, concurrency: int, stream: int, index: int) -> str:
    """The prompt of one request: its own tag first (`run` names the sweep), then a task."""
    task = TASKS[(stream + index * 3 + concurrency) % len(TASKS)]
    # the run id after the request's own numbers, so two requests of one sweep share
    # no more than "Request" and a digit or two
    return f"Request {concurrency}.{stream}.{index} of sweep {run}. {task}"


@dataclass
class LevelRun:
    """One level as measured: its figures over every repeat's requests, each repeat's
    own figures, and every request's metrics."""

    #: every request of every repeat, pooled (its duration: the repeats' durations added)
    level: Level
    metrics: list[Metrics] = field(default_factory=list, repr=False)
    samples: list[Sample] = field(default_factory=list, repr=False)
    #: each repeat on its own, in the order run (empty: `level` was the only run)
    repeats: list[Level] = field(default_factory=list)

    @property
    def concurrency(self) -> int:
        return self.level.concurrency

    @property
    def spread(self) -> RepeatSpread:
        """Aggregate output tok/s over the repeats: the figure the knee is read from."""
        return RepeatSpread(tuple(r.output_throughput for r in self.repeats or [self.level]))

    def step_from(self, before: LevelRun | None) -> LevelStep | None:
        """The step up to this level from `before` (None: this is the first level)."""
        if before is None:
            return None
        return LevelStep(before.concurrency, self.concurrency, before.spread, self.spread)

    @classmethod
    def pooled(cls, runs: Sequence[LevelRun], slo: Slo) -> LevelRun:
        """One level from its repeats (`runs`, each measured once, same concurrency)."""
        samples = [s for r in runs for s in r.samples]
        duration = sum(r.level.duration_s for r in runs)
        reduced = level(runs[0].concurrency, samples, duration, slo)
        metrics = [m for r in runs for m in r.metrics]
        return cls(reduced, metrics, samples, [r.level for r in runs])


@dataclass
class SweepResult:
    """Every level of a sweep, in the order run."""

    backend: str
    model: str
    slo: Slo
    per_stream: int
    max_tokens: int
    runs: list[LevelRun] = field(default_factory=list)
    #: runs of each level, and the most a noisy level gets
    repeats: int = 1
    max_repeats: int = 1
    #: requests sent before the first level to warm the server, in no figure
    warm_up_requests: int = 0
    #: the machine's 1-minute load average when the sweep started and ended (a client on
    #: the server's machine shares its cores: the figures are only as quiet as this)
    load: tuple[float | None, float | None] = (None, None)

    @property
    def levels(self) -> list[Level]:
        return [r.level for r in self.runs]

    @property
    def steps(self) -> list[LevelStep]:
        """Each step between consecutive levels, read from the medians of the repeats."""
        return steps([(r.concurrency, r.spread) for r in self.runs])

    @property
    def knee_reading(self) -> KneeReading:
        return read_knee(self.steps)

    @property
    def knee(self) -> int | None:
        return self.knee_reading.concurrency

    def record(self) -> dict[str, Any]:
        """The sweep as one JSON-ready object: a list of vLLM-named results, one a level
        (over every repeat's requests), each with its repeats' spread and its step."""
        into = {step.high: step for step in self.steps}
        unclear = self.knee_reading.unclear
        return {
            "type": "sweep",
            "backend": self.backend,
            "model_id": self.model,
            "requests_per_stream": self.per_stream,
            "max_tokens": self.max_tokens,
            "repeats": self.repeats,
            "max_repeats": self.max_repeats,
            "warm_up_requests": self.warm_up_requests,
            "goodput_slo_ms": {"ttft": self.slo.ttft_ms, "tpot": self.slo.tpot_ms},
            "knee_concurrency": self.knee,
            "knee_unclear": None if unclear is None else step_record(unclear),
            "load_average_1m": list(self.load),
            "levels": [run_record(r, into.get(r.concurrency)) for r in self.runs],
        }


def run_record(run: LevelRun, step: LevelStep | None) -> dict[str, Any]:
    """One level's vLLM fields, then its repeats: their median and p10-p90 aggregate
    output tok/s, each repeat's, and the step up to it from the level before."""
    spread = run.spread
    return {
        **run.level.record(),
        "repeats": len(spread.values),
        "median_output_throughput": spread.median,
        "p10_output_throughput": spread.p10,
        "p90_output_throughput": spread.p90,
        "repeat_output_throughput": list(spread.values),
        "step": None if step is None else step_record(step),
    }


def step_record(step: LevelStep) -> dict[str, Any]:
    """A step as JSON: its levels, size and growth (medians), and the noise judgement."""
    return {
        "from_concurrency": step.low,
        "to_concurrency": step.high,
        "change_output_throughput": step.change,
        "growth_per_doubling": step.growth,
        "noise_output_throughput": step.noise,
        "noisy": step.high_noisy,
        "inside_noise": step.inside_noise,
        "impossible": step.impossible,
    }


def sample_of(metrics: Metrics, gaps: Sequence[float], error: str | None) -> Sample:
    """The figures of one request that the sweep arithmetic needs."""
    return Sample(
        ttft_ms=metrics.ttft_ms,
        e2e_ms=metrics.e2e_ms,
        output_tokens=metrics.output_tokens,
        prompt_tokens=metrics.prompt_tokens,
        decode_tok_s=metrics.decode_tok_s,
        itl_ms=tuple(gaps),
        error=error,
    )


async def _request(backend: Backend, settings: Settings, prompt: str) -> tuple[Sample, Metrics]:
    turns = TurnController(backend, settings, trim=False)  # one turn: nothing to trim
    try:
        await turns.send(prompt)
    finally:
        await turns.aclose()
    exchange = turns.exchanges[-1]
    assert exchange.metrics is not None
    error = exchange.answer.error if exchange.answer.status == "error" else None
    return sample_of(exchange.metrics, itl_ms(exchange.trace), error), exchange.metrics


async def run_level(
    backend: Backend,
    concurrency: int,
    settings: Settings,
    per_stream: int,
    slo: Slo,
    run: str = "",
    *,
    first: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> LevelRun:
    """`concurrency` streams of `per_stream` requests each, at once (`run` tags the
    prompts: a new one per sweep; `first` numbers a stream's first request, so a
    repeat's prompts are its own). `clock` times the level (seconds)."""
    run = run or secrets.token_hex(4)
    results: list[tuple[Sample, Metrics]] = []

    async def stream(index: int) -> None:
        for i in range(first, first + per_stream):
            prompt = prompt_for(run, concurrency, index, i)
            results.append(await _request(backend, settings, prompt))

    t0 = clock()
    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    duration = clock() - t0
    samples = [s for s, _ in results]
    reduced = level(concurrency, samples, duration, slo)
    return LevelRun(reduced, [m for _, m in results], samples)


async def sweep(
    backend: Backend,
    levels: Sequence[int],
    settings: Settings,
    *,
    per_stream: int = DEFAULT_PER_STREAM,
    slo: Slo | None = None,
    on_level: Callable[[LevelRun], None] | None = None,
    warm_up: bool = True,
    repeats: int = DEFAULT_REPEATS,
    max_repeats: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SweepResult:
    """Run every level of `levels` on a started backend, lowest first, each `repeats`
    times, and a noisy one more, up to `max_repeats` runs (default: repeats +
    EXTRA_REPEATS); see the module's docstring. `on_level` sees each level once settled.

    `settings`' system prompt is not sent (see the module's docstring); its max_tokens,
    temperature and seed are."""
    if repeats < 1:
        raise ValueError("a sweep runs each level at least once")
    cap = max(repeats, repeats + EXTRA_REPEATS if max_repeats is None else max_repeats)
    settings = replace(settings, system="")
    result = SweepResult(backend.name, backend.model, slo or Slo(), per_stream, settings.max_tokens)
    result.repeats, result.max_repeats = repeats, cap
    start = load_average()
    tag = secrets.token_hex(4)  # new each sweep: no prompt is in the server's cache
    if warm_up:
        await _request(backend, settings, prompt_for(tag, 0, 0, 0))
        result.warm_up_requests = 1
    previous: LevelRun | None = None
    for c in levels:
        runs: list[LevelRun] = []
        while len(runs) < cap:
            if len(runs) >= repeats:
                step = LevelRun.pooled(runs, result.slo).step_from(previous)
                if step is None or not needs_repeat(step):  # the first level has no step
                    break
            first = len(runs) * per_stream  # a repeat's prompts are its own
            runs.append(
                await run_level(
                    backend, c, settings, per_stream, result.slo, tag, first=first, clock=clock
                )
            )
        run = LevelRun.pooled(runs, result.slo)
        result.runs.append(run)
        previous = run
        if on_level is not None:
            on_level(run)
    result.load = (start, load_average())
    return result


def load_average() -> float | None:
    """The 1-minute load average, None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
