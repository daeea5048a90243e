"""A concurrency sweep of a remote backend: the server's batching curve, measured.

At each level c, c streams run at once, each sending `per_stream` one-turn requests one
after another (a closed loop: a stream sends its next request when its answer ends, as
vLLM's `--max-concurrency` does). The level's duration is from its first send to its
last answer; `telemetry/sweep_stats.py` reduces the requests to throughput, latency
percentiles, goodput and the knee.

Prompts: every request's prompt starts with its own tag (level, stream, request, then a
random id of this sweep) before the task, and no system prompt is sent, so the only
prefix two requests share is the chat template's own opening (with any default system
prompt it adds): an engine's prefix cache cannot make a level cheap by reusing another
request's prompt, nor one from an earlier sweep of the same server. Before the first
level one request warms the server (its first request pays for loading and graph
building), and is not counted.
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
from phasechat.telemetry.sweep_stats import Level, Sample, Slo, knee, level

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


def prompt_for(run: str, concurrency: int, stream: int, index: int) -> str:
    """The prompt of one request: its own tag first (`run` names the sweep), then a task."""
    task = TASKS[(stream + index * 3 + concurrency) % len(TASKS)]
    # the run id after the request's own numbers, so two requests of one sweep share
    # no more than "Request" and a digit or two
    return f"Request {concurrency}.{stream}.{index} of sweep {run}. {task}"


@dataclass
class LevelRun:
    """One level as measured: its reduced figures and every request's metrics."""

    level: Level
    metrics: list[Metrics] = field(default_factory=list, repr=False)
    samples: list[Sample] = field(default_factory=list, repr=False)


@dataclass
class SweepResult:
    """Every level of a sweep, in the order run."""

    backend: str
    model: str
    slo: Slo
    per_stream: int
    max_tokens: int
    runs: list[LevelRun] = field(default_factory=list)
    #: the machine's 1-minute load average when the sweep started and ended (a client on
    #: the server's machine shares its cores: the figures are only as quiet as this)
    load: tuple[float | None, float | None] = (None, None)

    @property
    def levels(self) -> list[Level]:
        return [r.level for r in self.runs]

    @property
    def knee(self) -> int | None:
        return knee(self.levels)

    def record(self) -> dict[str, Any]:
        """The sweep as one JSON-ready object: a list of vLLM-named results, one a level."""
        return {
            "type": "sweep",
            "backend": self.backend,
            "model_id": self.model,
            "requests_per_stream": self.per_stream,
            "max_tokens": self.max_tokens,
            "goodput_slo_ms": {"ttft": self.slo.ttft_ms, "tpot": self.slo.tpot_ms},
            "knee_concurrency": self.knee,
            "load_average_1m": list(self.load),
            "levels": [lv.record() for lv in self.levels],
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
    session = TurnController(backend, settings)
    session.trimmer.enabled = False  # one turn: nothing to trim
    try:
        async for _ in session.send(prompt):
            pass
    finally:
        await session.aclose()
    exchange = session.exchanges[-1]
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
) -> LevelRun:
    """`concurrency` streams of `per_stream` requests each, at once (`run` tags the
    prompts: a new one per sweep)."""
    run = run or secrets.token_hex(4)
    results: list[tuple[Sample, Metrics]] = []

    async def stream(index: int) -> None:
        for i in range(per_stream):
            prompt = prompt_for(run, concurrency, index, i)
            results.append(await _request(backend, settings, prompt))

    t0 = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    duration = time.perf_counter() - t0
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
) -> SweepResult:
    """Run every level of `levels` on a started backend, lowest first.

    `settings`' system prompt is not sent (see the module's docstring); its max_tokens,
    temperature and seed are."""
    settings = replace(settings, system="")
    result = SweepResult(backend.name, backend.model, slo or Slo(), per_stream, settings.max_tokens)
    start = load_average()
    tag = secrets.token_hex(4)  # new each sweep: no prompt is in the server's cache
    if warm_up:
        await _request(backend, settings, prompt_for(tag, 0, 0, 0))
    for c in levels:
        run = await run_level(backend, c, settings, per_stream, result.slo, tag)
        result.runs.append(run)
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
