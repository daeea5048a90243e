"""The forecast's rates (telemetry/forecast.py) from histories whose figures are skewed,
so that the mean for the median, the oldest answers for the newest, or a fixed cost
taken from the wrong answers each give another known answer."""

from __future__ import annotations

import statistics

import pytest

from phasechat.telemetry.forecast import Forecast, Rates, forecast, measured_rates
from phasechat.telemetry.metrics import Metrics, metrics_from_dict
from tests.near import near


def answer(backend: str = "b", finish: str = "stop", **figures: float) -> Metrics:
    return metrics_from_dict({"backend": backend, "model": "m", "finish": finish, **figures})


def test_the_decode_rate_is_the_median_of_skewed_rates_not_their_mean() -> None:
    # one fast outlier: median 13.5, mean 22.6
    rates = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 90.0]
    measured = measured_rates([answer(decode_tok_s=r, output_tokens=50) for r in rates], "b")
    assert measured.decode_tok_s == pytest.approx(13.5)
    assert measured.decode_tok_s != pytest.approx(statistics.fmean(rates))
    assert (measured.prefill_tok_s, measured.samples, measured.overhead_ms) == (None, 8, 0.0)
    assert measured.attention_ms == 0.0


def test_only_the_newest_eight_finished_answers_count() -> None:
    # nine answers, then a failed one: the oldest (5) is out, the failed one is not
    # counted; the eight left (10..80) have the median 45 (all nine: 40; the oldest
    # eight: 35; with the failed one's 1,000: 55)
    history = [
        answer(decode_tok_s=r, output_tokens=50) for r in (5, 10, 20, 30, 40, 50, 60, 70, 80)
    ]
    history.append(answer(finish="error", decode_tok_s=1000.0, output_tokens=50))
    history.append(answer("other", decode_tok_s=1000.0, output_tokens=50))  # not this backend's
    measured = measured_rates(history, "b")
    assert measured.decode_tok_s == 45.0
    assert measured.samples == 8


def test_the_fixed_cost_is_the_median_of_ttft_less_the_engines_prompt_time() -> None:
    # one depth: 2 ms a token; TTFT less the engine's time: 5, 7, 30 ms: median 7, mean 14
    history = [
        answer(
            server_prompt_n=n,
            server_cache_n=0,
            server_prompt_ms=2.0 * n,
            ttft_ms=2.0 * n + extra,
            evaluated_prompt_tokens=n,
        )
        for n, extra in ((10, 5.0), (20, 30.0), (40, 7.0))
    ]
    measured = measured_rates(history, "b")
    assert measured.prefill_tok_s == pytest.approx(500.0)
    assert measured.overhead_ms == pytest.approx(7.0)
    assert (measured.samples, measured.attention_ms, measured.decode_tok_s) == (3, 0.0, None)


def test_an_engine_time_longer_than_the_ttft_is_no_point_of_the_fit() -> None:
    # the second answer's engine time (30 ms) is over its TTFT (20): not believed; an
    # engine time equal to the TTFT is (no fixed cost)
    history = [
        answer(server_prompt_n=10, server_prompt_ms=20.0, ttft_ms=20.0),
        answer(server_prompt_n=10, server_prompt_ms=30.0, ttft_ms=20.0),
    ]
    measured = measured_rates(history, "b")
    assert measured.prefill_tok_s == pytest.approx(500.0)  # 10 tokens in 20 ms
    assert measured.overhead_ms == 0.0


def test_a_forecast_has_every_field_known() -> None:
    rates = Rates(prefill_tok_s=1000.0, decode_tok_s=20.0, samples=3, overhead_ms=15.0,
                  attention_ms=0.01)  # fmt: skip
    # 100 new after 400 cached: 100 x 1 ms + 0.01 x 100 x 400 = 500 ms (the new tokens'
    # attention among themselves is in the 1 ms: telemetry/forecast.py); the other 9 of
    # 10 tokens at 20 tok/s: 450 ms more
    f = forecast(rates, 500, 400, 10, True)
    assert f == Forecast(
        prompt_tokens=500,
        cached_tokens=400,
        max_tokens=10,
        ttft_ms=near(15.0 + 500.0),
        total_ms=near(15.0 + 500.0 + 450.0),
        estimated_tokens=True,
        overhead_ms=15.0,
        prefill_ms=near(500.0),
    )
    assert f.new_tokens == 100
    # cached over the prompt: no new tokens, and the attention counts the prompt only
    held = forecast(rates, 50, 80, 1, False)
    assert (held.new_tokens, held.prefill_ms, held.ttft_ms, held.total_ms) == (0, 0.0, 15.0, 15.0)
    # no decode rate yet: no total; no prefill rate: nothing
    assert forecast(Rates(1000.0, None, 1), 10, 0, 5, False).total_ms is None
    unmeasured = forecast(Rates(None, 20.0, 0), 10, 0, 5, False)
    assert (unmeasured.ttft_ms, unmeasured.total_ms, unmeasured.prefill_ms) == (None, None, None)
