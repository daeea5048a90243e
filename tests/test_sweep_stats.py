"""The sweep's arithmetic (telemetry/sweep_stats.py) and its chart (phasechat/sweep_chart.py),
on numbers chosen by hand; the runner's repeat rule (chat/trips/sweep.py) on a backend
whose answers and clock are scripted."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import AsyncIterator

import numpy as np
import pytest

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta, Usage
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.sweep import LevelRun, SweepResult, sweep
from phasechat.chat.trips.sweep_chart import (
    result_chart,
    sweep_chart,
    sweep_notes,
    sweep_row,
    sweep_table,
)
from phasechat.telemetry.sweep_stats import (
    Level,
    LevelStep,
    RepeatSpread,
    Sample,
    Slo,
    growth,
    growth_per_doubling,
    knee,
    level,
    needs_repeat,
    parse_levels,
    read_knee,
    steps,
    summarize,
)
from tests.near import near
from tests.scripted import ScriptedBackend


def sample(ttft: float, e2e: float, tokens: int, **kw: object) -> Sample:
    return Sample(
        ttft_ms=ttft,
        e2e_ms=e2e,
        output_tokens=tokens,
        prompt_tokens=kw.get("prompt", 10),  # type: ignore[arg-type]
        decode_tok_s=kw.get("rate", 50.0),  # type: ignore[arg-type]
        itl_ms=kw.get("itl", ()),  # type: ignore[arg-type]
        error=kw.get("error"),  # type: ignore[arg-type]
    )


def test_tpot_is_vllms_first_token_excluded() -> None:
    assert sample(100, 1100, 11).tpot_ms == pytest.approx(100.0)  # (1100 - 100) / 10
    assert sample(100, 150, 1).tpot_ms is None
    assert sample(100, 1100, 11, error="boom").tpot_ms is None


def test_a_level_counts_throughput_and_percentiles() -> None:
    # rates 10, 20, 60: the median (20) is not the mean (30); the failed request's gaps
    # (5,000 ms) would move every ITL figure if they were pooled
    samples = [
        sample(100, 1100, 11, prompt=20, rate=10.0, itl=(90.0, 110.0)),
        sample(200, 2200, 21, prompt=30, rate=20.0, itl=(100.0,)),
        sample(300, 1300, 11, prompt=40, rate=60.0),
        sample(50, 60, 0, error="Server disconnected", itl=(5000.0, 5000.0)),
    ]
    lv = level(2, samples, duration_s=4.0, slo=Slo())
    assert (lv.completed, lv.failed) == (3, 1)
    assert lv.total_input_tokens == 90  # the failed request's prompt is not counted
    assert lv.total_output_tokens == 43
    assert lv.output_throughput == pytest.approx(43 / 4)
    assert lv.request_throughput == pytest.approx(3 / 4)
    assert lv.total_token_throughput == pytest.approx(133 / 4)
    assert lv.request_goodput is None  # no SLO given: as vLLM, null
    assert lv.per_user_decode_tok_s == pytest.approx(20.0)
    assert lv.ttft["median"] == pytest.approx(200.0)
    assert lv.ttft["mean"] == pytest.approx(200.0)
    assert lv.ttft["p99"] == pytest.approx(200 + 100 * 0.98)  # linear, as numpy
    assert lv.tpot["mean"] == pytest.approx(100.0)  # all three: 100 ms per token
    # pooled gaps of every request that completed: 90, 110, 100
    assert lv.itl["median"] == pytest.approx(100.0)
    assert lv.itl["p99"] == pytest.approx(float(np.percentile([90.0, 110.0, 100.0], 99)))
    assert lv.itl["std"] == pytest.approx(float(np.std([90.0, 110.0, 100.0])))
    assert lv.e2el["median"] == pytest.approx(1300.0)


def test_per_user_rate_is_the_median_of_an_even_count() -> None:
    rates = [10.0, 20.0, 35.0, 95.0]  # median 27.5, mean 40
    lv = level(4, [sample(100, 1100, 11, rate=r) for r in rates], 2.0, Slo())
    assert lv.per_user_decode_tok_s == pytest.approx(float(np.median(rates))) == 27.5


def test_std_is_the_population_std_as_numpys_and_vllms() -> None:
    ttfts = [100.0, 150.0, 400.0]  # population std 131.4, sample std 160.7
    lv = level(3, [sample(t, t + 1000, 11) for t in ttfts], 1.0, Slo())
    assert lv.ttft["std"] == pytest.approx(float(np.std(ttfts)))
    assert lv.ttft["mean"] == pytest.approx(float(np.mean(ttfts)))
    assert lv.ttft["p99"] == pytest.approx(float(np.percentile(ttfts, 99)))
    assert lv.record()["std_ttft_ms"] == pytest.approx(float(np.std(ttfts)))


def test_goodput_needs_every_slo_given() -> None:
    samples = [
        sample(100, 1100, 11),  # ttft 100, tpot 100
        sample(400, 900, 11),  # ttft 400, tpot 50
        sample(100, 600, 11),  # ttft 100, tpot 50
        sample(100, 150, 1),  # one token: tpot counts as 0
        sample(10, 20, 0, error="failed"),
    ]
    assert level(1, samples, 2.0, Slo(ttft_ms=200)).request_goodput == pytest.approx(3 / 2)
    assert level(1, samples, 2.0, Slo(tpot_ms=60)).request_goodput == pytest.approx(3 / 2)
    both = level(1, samples, 2.0, Slo(ttft_ms=200, tpot_ms=60))
    assert both.request_goodput == pytest.approx(2 / 2)


def at(concurrency: int, throughput: float, per_user: float | None = None) -> Level:
    """A level whose aggregate output rate is `throughput` tok/s over 1 s."""
    tokens = int(throughput)
    s = sample(10, 1000, tokens, rate=per_user) if tokens else sample(10, 20, 0, error="x")
    return level(concurrency, [s], 1.0, Slo())


def test_knee_is_where_a_doubling_stops_adding_ten_percent() -> None:
    levels = [at(1, 100), at(2, 180), at(4, 195), at(8, 200)]
    assert growth_per_doubling(levels[0], levels[1]) == pytest.approx(0.8)
    assert growth_per_doubling(levels[1], levels[2]) == pytest.approx(195 / 180 - 1)
    assert knee(levels) == 2  # 2 -> 4 adds 8%: more users now share the same throughput
    assert knee([at(1, 100), at(2, 150), at(4, 200)]) is None  # still growing at the end
    assert knee(list(reversed(levels))) == 2  # order given does not matter


def test_knee_scales_a_wider_step_to_one_doubling() -> None:
    # 1 -> 4 is two doublings: +15% over both is +7.2% per doubling, past the knee
    assert growth_per_doubling(at(1, 100), at(4, 115)) == pytest.approx(1.15**0.5 - 1)
    assert knee([at(1, 100), at(4, 115)]) == 1
    assert knee([at(1, 100), at(4, 125)]) is None  # +11.8% per doubling
    assert growth_per_doubling(at(1, 0), at(2, 10)) is None  # nothing to grow from
    # 1 -> 8 is three doublings (log2), not four (8 / 2): 1.6 ** (1/3) - 1 = +17.0%
    assert growth_per_doubling(at(1, 100), at(8, 160)) == pytest.approx(1.6 ** (1 / 3) - 1)
    assert growth_per_doubling(at(2, 100), at(6, 130)) == pytest.approx(
        1.3 ** (1 / math.log2(3)) - 1
    )


def test_parse_levels() -> None:
    assert parse_levels("1,2,4,8") == (1, 2, 4, 8)
    assert parse_levels(" 3, 5 ") == (3, 5)
    for bad in ("", "0,1", "1,x", "4,2", "1,1,2"):
        with pytest.raises(ValueError, match="--sweep"):
            parse_levels(bad)


def test_record_uses_vllms_field_names() -> None:
    record = level(4, [sample(100, 1100, 11)], 1.0, Slo(ttft_ms=500)).record()
    for name in (
        "max_concurrency",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "p99_e2el_ms",
    ):
        assert name in record, name
    assert record["max_concurrency"] == 4
    assert record["request_goodput"] == pytest.approx(1.0)


def test_chart_marks_the_knee_and_names_both_series() -> None:
    levels = [at(1, 100, 100.0), at(2, 180, 90.0), at(4, 195, 49.0), at(8, 200, 25.0)]
    text = sweep_chart(levels, knee(levels), width=70, height=16, title="a server")
    assert "\x1b[" not in text  # plain text unless asked for colour
    lines = text.splitlines()
    assert len(lines) == 16
    assert "a server" in lines[0]
    assert "aggregate output tok/s" in text and "per-user decode tok/s" in text
    ticks = next(line for line in lines if "knee" in line)
    assert ticks.split() == ["1", "2", "knee", "4", "8"]
    assert "230.0┤" in text  # the left axis: 15% above the top level's 200 tok/s
    coloured = sweep_chart(levels, None, width=70, height=16, color=True)
    assert "\x1b[" in coloured and "knee" not in coloured


def test_chart_of_nothing_is_empty() -> None:
    assert sweep_chart([], None) == ""


def test_notes_name_the_knee_a_noisy_run_and_the_load() -> None:
    result = SweepResult("openai", "m", Slo(), 2, 64)
    for c, throughput in ((1, 100), (2, 180), (4, 185), (8, 250)):
        result.runs.append(LevelRun(at(c, throughput)))
    result.load = (1.5, 2.25)
    notes = sweep_notes(result)
    assert notes[:3] == [
        "1 -> 2: aggregate +80% per doubling",
        "2 -> 4: aggregate +3% per doubling",
        "4 -> 8: aggregate +35% per doubling",
    ]
    assert notes[3].startswith("knee: concurrency 2 (the next doubling adds < 10%")
    assert "grew again past it" in notes[4]  # 4 -> 8 grew: the curve is not settled
    assert notes[5].startswith("load average (1 min): 1.50 at the start, 2.25 at the end")
    result.runs.pop()
    result.load = (None, None)
    assert len(sweep_notes(result)) == 3  # two steps and the knee: no noise, no load known
    # conc, runs, done, fail, agg (the median of one run: itself), its p10-p90
    assert sweep_row(result.runs[0]).split()[:6] == ["1", "1", "1", "0", "100.0", "100.0-100.0"]


def test_two_values_have_their_own_population_std() -> None:
    # one sample each side of the mean: the population std is the distance to it
    assert summarize([1.0, 3.0]) == {"mean": 2.0, "median": 2.0, "std": 1.0, "p99": 2.98}


def test_goodput_counts_a_request_exactly_at_its_slos() -> None:
    # TTFT 100 and TPOT (300 - 100) / (5 - 1) = 50 ms sit exactly at the SLOs: met (<=, as vLLM)
    at = Sample(ttft_ms=100.0, e2e_ms=300.0, output_tokens=5, prompt_tokens=10, decode_tok_s=20.0)
    over = Sample(ttft_ms=100.5, e2e_ms=300.5, output_tokens=5, prompt_tokens=10, decode_tok_s=20.0)
    under = Sample(ttft_ms=40.0, e2e_ms=200.0, output_tokens=5, prompt_tokens=10, decode_tok_s=25.0)
    slo = Slo(ttft_ms=100.0, tpot_ms=50.0)
    assert slo.met(at) and slo.met(under) and not slo.met(over)
    # 2 good requests over 2 s
    assert level(2, [at, over, under], 2.0, slo).request_goodput == pytest.approx(1.0)


# -- repeats: the median, the spread, the repeat rule, the knee inside the noise ---------


def test_a_spread_is_the_median_and_p10_p90_of_the_repeats() -> None:
    # the three runs at 2 streams: 40.7 to 49.0 tok/s
    three = RepeatSpread((49.0, 40.7, 45.0))
    assert three.median == 45.0
    assert three.p10 == pytest.approx(40.7 + 0.2 * 4.3)  # 41.56: position 0.2
    assert three.p90 == pytest.approx(45.0 + 0.8 * 4.0)  # 48.2: position 1.8
    assert three.width == pytest.approx(6.64)
    # two more runs near the middle: the outlier weighs less, the spread narrows (a
    # min-max spread would stay 8.3 however many repeats came)
    five = RepeatSpread((49.0, 40.7, 45.0, 45.0, 46.0))
    assert five.median == 45.0
    assert (five.p10, five.p90) == (near(42.42), near(47.8))
    assert five.width == pytest.approx(5.38)
    assert RepeatSpread((10.0, 20.0)).median == 15.0  # an even count: the middle two's mean
    assert RepeatSpread((10.0, 20.0)).width == pytest.approx(8.0)  # 11 to 19
    assert RepeatSpread((50.0,)).width == 0.0  # one run: no spread
    assert float(np.percentile([40.7, 45.0, 49.0], 90)) == pytest.approx(three.p90)
    with pytest.raises(ValueError, match="at least one"):
        RepeatSpread(())


def test_a_step_inside_its_levels_spread_is_repeated() -> None:
    two = RepeatSpread((40.7, 45.0, 49.0))  # median 45, width 6.64
    # clean: 23 -> 45 is a step of 22 tok/s, wider than either spread (1.6, 6.64)
    clean = LevelStep(1, 2, RepeatSpread((22.0, 23.0, 24.0)), two)
    assert clean.change == pytest.approx(22.0)
    assert clean.growth == pytest.approx(45 / 23 - 1)  # +96%: possible, barely
    assert not clean.high_noisy and not clean.inside_noise and not clean.impossible
    assert not needs_repeat(clean)
    # noisy: 45 -> 47 is a step of 2; the 4-stream runs spread 6.4 (44.6 to 51)
    noisy = LevelStep(2, 4, two, RepeatSpread((44.0, 47.0, 52.0)))
    assert noisy.change == pytest.approx(2.0)
    assert noisy.high_spread.width == pytest.approx(6.4)
    assert noisy.high_noisy and noisy.inside_noise and needs_repeat(noisy)
    # the low level's spread makes the step unreadable, but repeating the high one
    # cannot narrow it: not repeated, and not believed
    low_wide = LevelStep(1, 2, RepeatSpread((10.0, 30.0, 50.0)), RepeatSpread((31.0, 32.0, 33.0)))
    assert low_wide.noise == pytest.approx(32.0) and low_wide.change == pytest.approx(2.0)
    assert low_wide.inside_noise and not low_wide.high_noisy and not needs_repeat(low_wide)
    # a level that fell: the step's size counts, not its sign
    fell = LevelStep(4, 8, RepeatSpread((100.0,)), RepeatSpread((80.0, 81.0, 82.0)))
    assert fell.change == pytest.approx(-19.0) and not fell.inside_noise


def test_growth_above_one_doubling_is_flagged_impossible() -> None:
    # the reading: one run at 2 streams (40.7) and one at 4: "+110% per doubling"
    one_each = LevelStep(2, 4, RepeatSpread((40.7,)), RepeatSpread((40.7 * 2.1,)))
    assert one_each.growth == pytest.approx(1.1)
    assert one_each.impossible and needs_repeat(one_each)  # no spread, still repeated
    # the medians of three runs each read the same levels as +38%, with the 85.5 run an
    # outlier whose spread (20.4) is wider than the step (17): repeated ...
    three = LevelStep(2, 4, RepeatSpread((40.7, 45.0, 49.0)), RepeatSpread((85.47, 60.0, 62.0)))
    assert three.growth == pytest.approx(62 / 45 - 1) and not three.impossible
    assert three.high_spread.width == pytest.approx(62 + 0.8 * 23.47 - 60.4)
    assert three.high_noisy and needs_repeat(three)
    # ... and two more runs settle it: spread 16.1 (60.4 to 76.5), step still 17
    five = LevelStep(2, 4, three.low_spread, RepeatSpread((85.47, 60.0, 62.0, 61.0, 63.0)))
    assert five.high_spread.width == pytest.approx(63 + 0.6 * 22.47 - 60.4)
    assert not five.high_noisy and not needs_repeat(five)
    # exactly doubled per doubling is a perfect server, not an impossible one; two
    # doublings (1 -> 4) may at most quadruple
    assert not LevelStep(1, 2, RepeatSpread((10.0,)), RepeatSpread((20.0,))).impossible
    assert not LevelStep(1, 4, RepeatSpread((100.0,)), RepeatSpread((400.0,))).impossible
    assert LevelStep(1, 4, RepeatSpread((100.0,)), RepeatSpread((500.0,))).growth == pytest.approx(
        5**0.5 - 1
    )
    assert LevelStep(1, 4, RepeatSpread((100.0,)), RepeatSpread((500.0,))).impossible


def test_the_knee_is_not_claimed_from_a_step_inside_the_noise() -> None:
    one, two = RepeatSpread((22.0, 23.0, 24.0)), RepeatSpread((44.0, 45.0, 46.0))
    clean = [(1, one), (2, two), (4, RepeatSpread((47.5, 48.0, 48.5)))]
    # 45 -> 48 is +6.7% per doubling, a step of 3 wider than both spreads (1.6, 0.8)
    reading = read_knee(steps(clean))
    assert reading.concurrency == 2 and reading.unclear is None
    # the same median at 4 (47), from runs spread 44.6 to 51: a step of 2 inside 6.4
    noisy = [(1, one), (2, two), (4, RepeatSpread((44.0, 47.0, 52.0))), (8, RepeatSpread((47.0,)))]
    reading = read_knee(steps(noisy))
    assert reading.concurrency is None
    assert reading.unclear is not None and (reading.unclear.low, reading.unclear.high) == (2, 4)
    # the first level's own spread counts too: 30 -> 32 inside its 32 tok/s
    wide_first = [(1, RepeatSpread((10.0, 30.0, 50.0))), (2, RepeatSpread((31.0, 32.0, 33.0)))]
    assert read_knee(steps(wide_first)).unclear is not None
    # single runs have no spread: the knee as before
    assert knee([at(1, 100), at(2, 180), at(4, 195)]) == 2
    # steps come in increasing concurrency whatever the order given
    assert [(s.low, s.high) for s in steps(list(reversed(clean)))] == [(1, 2), (2, 4)]


def run_of(concurrency: int, *aggregates: float) -> LevelRun:
    """A level run once per aggregate rate given (each over 1 s)."""
    runs = [LevelRun(at(concurrency, a), samples=list(_samples(a))) for a in aggregates]
    return LevelRun.pooled(runs, Slo())


def _samples(throughput: float) -> list[Sample]:
    return [sample(10, 1000, int(throughput))]


def test_a_noisy_level_is_flagged_in_the_table_the_notes_and_the_chart() -> None:
    result = SweepResult("openai", "m", Slo(), 2, 64, repeats=3, max_repeats=5)
    result.warm_up_requests = 1
    result.runs = [run_of(1, 22, 23, 24), run_of(2, 44, 45, 46), run_of(4, 44, 47, 52)]
    result.runs.append(run_of(8, 99))  # one run: 47 -> 99 more than doubled (+111%)
    table = sweep_table(result)
    assert table[1].split()[:6] == ["1", "3", "3", "0", "23.0", "22.2-23.8"]
    flagged = table[3].splitlines()
    assert flagged[0].split()[:6] == ["4", "3", "3", "0", "47.0", "44.6-51.0"]
    assert flagged[1].strip() == "^ noisy: spread 6.4 wider than step 2.0 tok/s (from 2)"
    impossible = table[4].splitlines()[1].strip()
    assert impossible.startswith("^ impossible: +111% per doubling from 4 (at most +100%)")
    assert table[-1] == "warm-up: 1 request before the first level (not in the figures)"
    notes = sweep_notes(result)
    assert notes[1] == (
        "2 -> 4: aggregate +4% per doubling (inside the noise: spread 6.4 wider than step"
        " 2.0 tok/s)"
    )
    assert notes[2] == (
        "4 -> 8: aggregate +111% per doubling (impossible: measurement noise, not the server)"
    )
    assert notes[3] == (
        "knee: not claimed: 2 -> 4 adds +4% per doubling (< 10%) inside the noise"
        " (spread 6.4 > step 2.0 tok/s)"
    )
    assert notes[4].startswith("each level ran 3 times (a noisy one up to 5)")
    ticks = next(line for line in result_chart(result, width=80).splitlines() if "noisy" in line)
    assert ticks.split() == ["1", "2", "4", "noisy", "8", "noisy"]
    record = result.record()
    assert (record["repeats"], record["max_repeats"], record["warm_up_requests"]) == (3, 5, 1)
    assert record["knee_concurrency"] is None
    assert record["knee_unclear"]["from_concurrency"] == 2
    four = record["levels"][2]
    assert four["repeat_output_throughput"] == [44.0, 47.0, 52.0]
    assert (four["median_output_throughput"], four["p10_output_throughput"]) == (47.0, 44.6)
    assert four["step"]["noisy"] and not four["step"]["impossible"]
    assert record["levels"][3]["step"]["impossible"]
    assert record["levels"][0]["step"] is None
    json.dumps(record)  # JSON-ready


class RepeatScript(ScriptedBackend):
    """Answers `tokens[(level, repeat)]` tokens to each request (its level and number are
    in its prompt's tag), so a repeat's aggregate rate over a scripted 1 s is the sum."""

    def __init__(self, tokens: dict[tuple[int, int], int], per_stream: int) -> None:
        super().__init__("openai")
        self.tokens, self.per_stream = tokens, per_stream
        self.prompts: list[str] = []

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        prompt = request.messages[-1].content
        self.prompts.append(prompt)
        tag = re.match(r"Request (\d+)\.\d+\.(\d+) ", prompt)
        assert tag is not None, prompt
        level, index = int(tag[1]), int(tag[2])
        n = self.tokens.get((level, index // self.per_stream), 1)
        for _ in range(n):
            yield TextDelta("w ")
        yield Usage(prompt_tokens=20, completion_tokens=n)
        yield Finished("stop")


def one_second_each() -> itertools.count[int]:
    """A clock that reads 1 s later each time: the sweep reads it at a repeat's start and
    end, so every repeat lasts 1 s and its aggregate is its tokens."""
    return itertools.count()


async def test_the_runner_repeats_a_level_wider_than_its_step_then_flags_it() -> None:
    # level 1: 20 tok/s three times. Level 2 (two streams, one request each): 20, 60,
    # 30 -> median 30, a step of 10 inside a spread of 32 (22 to 54): repeated; 60 ->
    # median 45, step 25 inside 37; 20 -> median 30, step 10 inside 40 (20 to 60), and
    # the cap (3 + 2) is reached: flagged. Level 4: 32 tok/s three times, clean.
    per_request = {(1, r): 20 for r in range(5)}
    per_request |= {(2, r): n // 2 for r, n in enumerate((20, 60, 30, 60, 20))}
    per_request |= {(4, r): 8 for r in range(5)}
    backend = RepeatScript(per_request, per_stream=1)
    clock = one_second_each()
    result = await sweep(
        backend, (1, 2, 4), Settings(max_tokens=64), per_stream=1, clock=lambda: next(clock)
    )
    assert (result.repeats, result.max_repeats) == (3, 5)
    assert [len(r.repeats) for r in result.runs] == [3, 5, 3]
    assert result.runs[1].spread.values == (20.0, 60.0, 30.0, 60.0, 20.0)
    assert result.runs[1].spread.median == 30.0
    one_two, two_four = result.steps
    assert one_two.high_noisy and one_two.high_spread.width == pytest.approx(40.0)
    assert not two_four.high_noisy  # 32, 32, 32 has no spread ...
    # ... but its step (+7% per doubling) is inside level 2's noise: no knee claimed
    assert result.knee is None and result.knee_reading.unclear == two_four
    row = sweep_row(result.runs[1], result.runs[1].step_from(result.runs[0]))
    assert row.splitlines()[0].split()[:5] == ["2", "5", "10", "0", "30.0"]
    assert row.splitlines()[1].strip() == "^ noisy: spread 40.0 wider than step 10.0 tok/s (from 1)"
    # every request the backend saw is in the table, but the warm-up, which is named
    done = sum(lv.completed + lv.failed for lv in result.levels)
    assert len(backend.prompts) == done + 1 == 3 + 10 + 12 + 1
    assert result.warm_up_requests == 1 and "warm-up: 1 request" in sweep_table(result)[-1]
    # each repeat's prompts are its own
    assert len(set(backend.prompts)) == len(backend.prompts)
    record = result.record()
    assert record["levels"][1]["repeats"] == 5 and record["levels"][1]["step"]["noisy"]
    assert record["levels"][1]["completed"] == 10  # the vLLM fields pool every repeat


async def test_a_noisy_level_stops_repeating_once_its_spread_settles() -> None:
    # level 2: 40, 40, 80 (step 20 inside 32), 40 (inside 28), 40 (inside 24), 40: the
    # spread of 40 x 5 and 80 is 20 (40 to 60), not wider than the step: settled at 6
    per_request = {(1, r): 20 for r in range(8)}
    per_request |= {(2, r): n // 2 for r, n in enumerate((40, 40, 80, 40, 40, 40, 40, 40))}
    backend = RepeatScript(per_request, per_stream=1)
    clock = one_second_each()
    result = await sweep(
        backend, (1, 2), Settings(max_tokens=64), per_stream=1, max_repeats=8,
        clock=lambda: next(clock), warm_up=False,
    )  # fmt: skip
    assert [len(r.repeats) for r in result.runs] == [3, 6]
    assert not result.steps[0].high_noisy
    assert result.warm_up_requests == 0 and sweep_table(result)[-1].startswith("warm-up: none")
    with pytest.raises(ValueError, match="at least once"):
        await sweep(backend, (1,), Settings(), repeats=0)


def test_tpot_starts_at_two_tokens_and_a_one_token_answer_meets_a_tpot_slo() -> None:
    two = Sample(
        ttft_ms=100.0, e2e_ms=300.0, output_tokens=2, prompt_tokens=None, decode_tok_s=None
    )
    one = Sample(
        ttft_ms=100.0, e2e_ms=100.0, output_tokens=1, prompt_tokens=None, decode_tok_s=None
    )
    assert two.tpot_ms == 200.0 and one.tpot_ms is None
    # vLLM counts a one-token answer's TPOT as 0: it meets even a 0.5 ms TPOT objective
    assert Slo(tpot_ms=0.5).met(one) and not Slo(tpot_ms=199.0).met(two)
    # a missing prompt count adds nothing to the level's input tokens
    counted = Sample(ttft_ms=1.0, e2e_ms=2.0, output_tokens=3, prompt_tokens=10, decode_tok_s=None)
    assert level(1, [one, counted], 1.0, Slo()).total_input_tokens == 10
    with pytest.raises(ValueError, match="positive"):
        level(1, [one], 0.0, Slo())


def test_growth_needs_a_higher_level_and_accepts_a_low_rate_under_one() -> None:
    assert growth(2, 10.0, 2, 10.0) is None
    assert growth(1, 0.5, 2, 1.0) == 1.0


def test_a_step_as_wide_as_its_noise_is_believed_and_a_fall_is_measured_by_its_size() -> None:
    # low: median 100, p10-p90 96-104 (width 8); high 108: the step (8) equals the noise
    step = LevelStep(1, 2, RepeatSpread((95.0, 105.0)), RepeatSpread((108.0,)))
    assert step.noise == 8.0 and step.change == 8.0 and not step.inside_noise
    # a fall of 10 with a high spread of width 8 (86-94): the high level is measured well
    fall = LevelStep(1, 2, RepeatSpread((100.0,)), RepeatSpread((85.0, 95.0)))
    assert fall.change == -10.0 and not fall.high_noisy


def test_a_growth_exactly_at_the_threshold_is_not_yet_the_knee() -> None:
    points = [(1, RepeatSpread((100.0,))), (2, RepeatSpread((150.0,))), (4, RepeatSpread((150.0,)))]
    assert read_knee(steps(points), threshold=0.5).concurrency == 2


def test_every_field_of_a_level_whose_requests_arrive_out_of_order() -> None:
    # the per-user rates arrive 95, 10, 35, 20: their median is 27.5 (sorted: 10 20 35
    # 95); taken in arrival order it would be 22.5, their mean 40
    samples = [
        sample(100, 1100, 11, prompt=20, rate=95.0, itl=(90.0, 110.0)),  # tpot 100
        sample(300, 1300, 21, prompt=30, rate=10.0, itl=(40.0,)),  # tpot 50, ttft over
        sample(200, 700, 6, prompt=50, rate=35.0),  # tpot 100
        sample(150, 650, 2, prompt=40, rate=20.0),  # tpot 500, over
        sample(50, 60, 0, prompt=99, rate=70.0, error="reset", itl=(5000.0,)),
    ]
    lv = level(2, samples, 4.0, Slo(ttft_ms=250.0, tpot_ms=200.0))
    assert lv.record() == {
        "max_concurrency": 2,
        "duration": 4.0,
        "completed": 4,
        "failed": 1,
        "total_input_tokens": 140,
        "total_output_tokens": 40,
        "request_throughput": 1.0,
        "request_goodput": 0.5,  # the first and the third met both
        "output_throughput": 10.0,
        "total_token_throughput": 45.0,
        "per_user_decode_tok_s": 27.5,
        # TTFT 100 300 200 150
        "mean_ttft_ms": 187.5,
        "median_ttft_ms": 175.0,
        "std_ttft_ms": pytest.approx(math.sqrt(21875 / 4)),
        "p99_ttft_ms": pytest.approx(200 + 100 * 0.97),
        # TPOT 100 50 100 500
        "mean_tpot_ms": 187.5,
        "median_tpot_ms": 100.0,
        "std_tpot_ms": pytest.approx(math.sqrt(131875 / 4)),
        "p99_tpot_ms": pytest.approx(100 + 400 * 0.97),
        # the gaps of the requests that completed: 90 110 40
        "mean_itl_ms": 80.0,
        "median_itl_ms": 90.0,
        "std_itl_ms": pytest.approx(math.sqrt(2600 / 3)),
        "p99_itl_ms": pytest.approx(90 + 20 * 0.98),
        # e2e 1100 1300 700 650
        "mean_e2el_ms": 937.5,
        "median_e2el_ms": 900.0,
        "std_e2el_ms": pytest.approx(math.sqrt(296875 / 4)),
        "p99_e2el_ms": pytest.approx(1100 + 200 * 0.97),
    }


def test_a_spread_of_repeats_in_any_order_and_a_step_of_their_medians() -> None:
    # repeats arrive 30, 10, 20, 40: p10 13, median 25, p90 37 (in arrival order: p10
    # 22, median 15, p90 37)
    low = RepeatSpread((30.0, 10.0, 20.0, 40.0))
    assert (low.median, low.p10, low.p90) == (25.0, near(13.0), near(37.0))
    assert low.width == pytest.approx(24.0)
    high = RepeatSpread((60.0, 40.0))  # median 50, p10 42, p90 58: width 16
    step = LevelStep(2, 8, low, high)  # two doublings
    assert step.change == 25.0
    assert step.growth == pytest.approx(2**0.5 - 1)  # 25 -> 50 over two doublings
    assert (step.noise, step.high_noisy, step.inside_noise) == (near(24.0), False, False)
    assert not step.impossible and not needs_repeat(step)
    wide = LevelStep(2, 8, low, RepeatSpread((20.0, 80.0)))  # median 50, width 48 > the step (25)
    assert wide.high_noisy and wide.inside_noise and needs_repeat(wide)


def test_a_level_where_every_request_failed_has_no_figures_but_its_counts() -> None:
    failed = [sample(10, 20, 0, error="reset"), sample(10, 20, 3, error="timeout")]
    lv = level(2, failed, 2.0, Slo(ttft_ms=100.0))
    assert (lv.completed, lv.failed, lv.total_input_tokens, lv.total_output_tokens) == (0, 2, 0, 0)
    assert (lv.request_throughput, lv.request_goodput, lv.output_throughput) == (0.0, 0.0, 0.0)
    assert lv.per_user_decode_tok_s is None
    none = {"mean": None, "median": None, "std": None, "p99": None}
    assert (lv.ttft, lv.tpot, lv.itl, lv.e2el) == (none, none, none, none)
    assert summarize([7.0]) == {"mean": 7.0, "median": 7.0, "std": 0.0, "p99": 7.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--sweep levels must be 1 or more"),
        ("0,2", "--sweep levels must be 1 or more"),
        ("2,1", "--sweep levels must increase, each once (e.g. 1,2,4,8)"),
        ("1,1", "--sweep levels must increase, each once (e.g. 1,2,4,8)"),
        ("1,two", "--sweep expects integers like 1,2,4,8, not '1,two'"),
    ],
)
def test_bad_levels_are_refused_with_their_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--sweep") as info:
        parse_levels(text)
    assert str(info.value) == message
