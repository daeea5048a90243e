"""The sweep's arithmetic (telemetry/sweep_stats.py) and its chart (phasechat/sweep_chart.py),
on numbers chosen by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phasechat.chat.trips.sweep import LevelRun, SweepResult
from phasechat.chat.trips.sweep_chart import sweep_chart, sweep_notes, sweep_row
from phasechat.telemetry.sweep_stats import (
    Level,
    Sample,
    Slo,
    growth_per_doubling,
    knee,
    level,
    parse_levels,
    summarize,
)


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
    assert (sweep_row(result.levels[0]).split()[:4]) == ["1", "1", "0", "100.0"]


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
