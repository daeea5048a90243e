"""The sweep's runner (chat/trips/sweep.py) on a scripted server whose usage is known:
each request's figures as the sweep arithmetic gets them (the whole prompt, cached
tokens included), and one level's totals over a scripted clock."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta, Usage
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.sweep import (
    LevelRun,
    SweepResult,
    prompt_for,
    run_level,
    sample_of,
    sweep,
)
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.sweep_stats import Sample, Slo, level
from tests.near import near
from tests.scripted import ScriptedBackend


def test_a_sample_carries_the_whole_prompt_cached_tokens_included() -> None:
    m = metrics_from_dict(
        {
            "backend": "b",
            "model": "m",
            "finish": "stop",
            "ttft_ms": 120.0,
            "e2e_ms": 900.0,
            "output_tokens": 14,
            "prompt_tokens": 100,
            "cached_tokens": 40,
            "evaluated_prompt_tokens": 60,
            "decode_tok_s": 33.0,
        }
    )
    assert sample_of(m, [10.0, 12.5], None) == Sample(
        ttft_ms=120.0,
        e2e_ms=900.0,
        output_tokens=14,
        prompt_tokens=100,  # not the 60 evaluated
        decode_tok_s=33.0,
        itl_ms=(10.0, 12.5),
        error=None,
    )
    assert sample_of(m, [], "reset").error == "reset"


class Cached(ScriptedBackend):
    """A server that says each prompt was 50 tokens, 32 of them cached, and answers 8."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        for _ in range(8):
            yield TextDelta("w ")
        yield Usage(prompt_tokens=50, completion_tokens=8, cached_tokens=32)
        yield Finished("stop")


async def test_a_levels_input_tokens_count_the_cached_ones() -> None:
    clock = itertools.count(5, 2)  # the level lasts 2 s of this clock, from 5 to 7
    run = await run_level(
        Cached("openai"), 3, Settings(max_tokens=8), 2, Slo(), "tag", clock=lambda: next(clock)
    )
    lv = run.level
    assert (lv.concurrency, lv.duration_s, lv.completed, lv.failed) == (3, 2.0, 6, 0)
    assert (lv.total_input_tokens, lv.total_output_tokens) == (6 * 50, 6 * 8)
    assert lv.output_throughput == 24.0 and lv.total_token_throughput == 174.0
    assert lv.request_throughput == 3.0 and lv.request_goodput is None
    assert [s.prompt_tokens for s in run.samples] == [50] * 6
    assert [m.cached_tokens for m in run.metrics] == [32] * 6


def test_each_requests_prompt_has_its_own_tag_before_its_task() -> None:
    assert prompt_for("ab12", 4, 1, 2) == (
        "Request 4.1.2 of sweep ab12. "
        "List the planets of the solar system and tell one surprising fact about each."
    )  # task (stream 1 + request 2 x 3 + level 4) % 8 = 3, the fourth
    assert prompt_for("ab12", 1, 0, 0).endswith(
        "Write a short story about a lighthouse keeper who finds a message in a bottle."
    )


@pytest.mark.parametrize("index", [0, 1])
def test_the_task_turns_with_the_stream_the_request_and_the_level(index: int) -> None:
    first = prompt_for("r", 2, index, 0).split(". ", 1)[1]
    assert first != prompt_for("r", 2, index, 1).split(". ", 1)[1]


async def test_repeats_pool_their_requests_over_their_durations_added() -> None:
    backend = Cached("openai")
    runs = []
    for seconds in (2, 6):  # the first repeat takes 2 s, the second 6
        clock = itertools.count(10, seconds)
        runs.append(await run_level(backend, 2, Settings(), 1, Slo(), "t", clock=clock.__next__))
    pooled = LevelRun.pooled(runs, Slo())
    # 4 requests of 8 tokens over 8 s (not the longest 6 s, not the mean 4 s)
    assert (pooled.level.duration_s, pooled.level.completed) == (8.0, 4)
    assert pooled.level.output_throughput == 4.0
    assert pooled.spread.values == (8.0, near(16 / 6))  # each repeat's own rate
    assert pooled.spread.median == pytest.approx((8.0 + 16 / 6) / 2)
    assert len(pooled.metrics) == len(pooled.samples) == 4 and pooled.concurrency == 2


def test_a_sweeps_record_has_each_levels_spread_and_step() -> None:
    def run(concurrency: int, rates: tuple[float, ...]) -> LevelRun:
        # each repeat: one request of `rate` tokens over 1 s
        repeats = [level(concurrency, [Sample(10.0, 1000.0, int(r), 5, None)], 1.0, Slo())
                   for r in rates]  # fmt: skip
        samples = [Sample(10.0, 1000.0, int(r), 5, None) for r in rates]
        pooled = level(concurrency, samples, float(len(rates)), Slo())
        return LevelRun(pooled, [], samples, repeats)

    result = SweepResult("srv", "m", Slo(ttft_ms=50.0), 1, 64, repeats=2, max_repeats=4)
    result.runs = [run(1, (100.0, 110.0)), run(4, (150.0, 170.0))]
    result.load = (0.5, 1.5)
    record = result.record()
    assert {k: v for k, v in record.items() if k != "levels"} == {
        "type": "sweep",
        "backend": "srv",
        "model_id": "m",
        "requests_per_stream": 1,
        "max_tokens": 64,
        "repeats": 2,
        "max_repeats": 4,
        "warm_up_requests": 0,
        "goodput_slo_ms": {"ttft": 50.0, "tpot": None},
        "knee_concurrency": None,  # 105 -> 160 over two doublings: +23% each
        "knee_unclear": None,
        "load_average_1m": [0.5, 1.5],
    }
    low, high = record["levels"]
    assert (low["max_concurrency"], low["repeats"], low["step"]) == (1, 2, None)
    assert low["repeat_output_throughput"] == [100.0, 110.0]
    assert (low["median_output_throughput"], low["output_throughput"]) == (105.0, 105.0)
    assert (low["p10_output_throughput"], low["p90_output_throughput"]) == (
        pytest.approx(101.0),
        pytest.approx(109.0),
    )
    assert high["step"] == {
        "from_concurrency": 1,
        "to_concurrency": 4,
        "change_output_throughput": 55.0,
        "growth_per_doubling": pytest.approx((160 / 105) ** 0.5 - 1),
        "noise_output_throughput": pytest.approx(16.0),  # the high level's 152 to 168
        "noisy": False,
        "inside_noise": False,
        "impossible": False,
    }


async def test_each_repeat_of_a_level_sends_prompts_of_its_own() -> None:
    prompts: list[str] = []

    class Recording(Cached):
        async def stream(
            self, request: GenerationRequest, *, every_s: float | None = None
        ) -> AsyncIterator[Event]:
            prompts.append(request.messages[-1].content)
            async for event in super().stream(request, every_s=every_s):
                yield event

    clock = itertools.count()
    await sweep(Recording("openai"), (1,), Settings(), per_stream=2, repeats=2, warm_up=False,
                clock=lambda: next(clock))  # fmt: skip
    numbers = [p.split(" of sweep")[0] for p in prompts]
    assert numbers == ["Request 1.0.0", "Request 1.0.1", "Request 1.0.2", "Request 1.0.3"]


async def test_a_cap_below_the_repeats_still_runs_every_repeat() -> None:
    clock = itertools.count()
    result = await sweep(Cached("openai"), (1, 2), Settings(), per_stream=1, repeats=3,
                         max_repeats=1, warm_up=False, clock=lambda: next(clock))  # fmt: skip
    assert (result.repeats, result.max_repeats) == (3, 3)
    assert [len(r.repeats) for r in result.runs] == [3, 3]
    # with no cap given: the repeats and EXTRA_REPEATS (2) more at most
    free = await sweep(Cached("openai"), (1,), Settings(), per_stream=1, repeats=2,
                       warm_up=False, clock=lambda: next(clock))  # fmt: skip
    assert (free.repeats, free.max_repeats) == (2, 4)
