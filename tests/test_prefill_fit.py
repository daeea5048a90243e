"""The prefill forecast (issue 36, item 6): fitted on the engine's own prompt time as a
cost per new token plus a cost per new token per cached token before it (attention), by least
squares (each answer weighted by the tokens it read), with the fixed cost of a request
measured as TTFT less the engine's time; never priced with a wait for the model."""

from __future__ import annotations

import pytest

from phasechat.telemetry.forecast import Rates, fit_prefill, forecast, measured_rates
from phasechat.telemetry.metrics import Metrics, metrics_from_dict
from tests.near import near

#: (new tokens, cached before them, the engine's prompt ms) at 2 ms a token and 0.01 ms
#: a token per cached token: 10 + 0: 20; 10 + 1,000: 20 + 0.01 x 10 x 1,000; 100 + 0:
#: 200. (Priced with the new tokens' attention among themselves, `cached + (n + 1) / 2`,
#: the same points fit 1.48 ms a token and 0.0104 ms: bench.prefill_grid measured that
#: term far cheaper in one big batch than the short turns' attention to the cache.)
POINTS = [(10, 0, 20.0), (10, 1000, 120.0), (100, 0, 200.0)]


def engine_answer(n: int, cached: int, ms: float, fixed: float = 5.0, **more: float) -> Metrics:
    return metrics_from_dict(
        {
            "backend": "b",
            "model": "m",
            "finish": "stop",
            "evaluated_prompt_tokens": n,
            "cached_tokens": cached,
            "server_prompt_n": n,
            "server_cache_n": cached,
            "server_prompt_ms": ms,
            "ttft_ms": ms + fixed,
            **more,
        }
    )


def test_the_fit_tells_a_tokens_cost_from_its_attention_to_those_before_it() -> None:
    c, k, b = fit_prefill(POINTS) or (0.0, 0.0, 0.0)
    assert (c, k, b) == (near(2.0), near(0.01), 0.0)  # no long read
    # at one depth the two cannot be told apart: one cost a token, weighted by the tokens
    # read (through the origin: (20 x 60 + 40 x 130) / (20² + 40²) = 3.2), not the mean
    # of the two rates (3 and 3.25 ms a token)
    assert fit_prefill([(20, 300, 60.0), (40, 300, 130.0)]) == (near(3.2), 0.0, 0.0)
    assert fit_prefill([]) is None and fit_prefill([(20, 0, 0.0)]) is None


#: 4 ms a token, 0.004 ms a token per cached token, 0.0012 ms a token per new token
#: before it in the read: (20, 0): 80 + 0.0012 x 210; (20, 300): + 0.004 x 20 x 300 ...;
#: (600, 0): 2,400 + 0.0012 x 180,300 = 2,616.36
GRID = [(20, 0, 80.252), (20, 300, 104.252), (20, 600, 128.252), (40, 100, 176.984)]
LONG = (600, 0, 2616.36)


def test_a_long_read_shows_the_new_tokens_attention_among_themselves() -> None:
    # c and k from the short reads, then b from the long one, in turn (4 rounds: within
    # a part in 10,000)
    assert fit_prefill([*GRID, LONG]) == (
        near(4.0, rel=1e-4),
        near(0.004, rel=1e-4),
        near(0.0012, rel=1e-4),
    )
    # short turns only: that term cannot be told from noise, and is 0 (not fitted to
    # the 0.25 ms it adds to each); the others as before, nearly
    c, k, b = fit_prefill(GRID) or (0.0, 0.0, 0.0)
    assert b == 0.0 and c == pytest.approx(4.0, rel=0.01) and k == pytest.approx(0.004, rel=0.01)
    # a read of 600 among reads of 600 is not long: the median is 600
    assert fit_prefill([LONG, (600, 100, 2856.36)])[2] == 0.0  # type: ignore[index]
    # the forecast of a 1,000-token read from nothing with all three: 4,000 + 0.0012 x
    # 500,500 = 4,600.6 ms (without the long read's term: 4,000)
    rates = measured_rates([engine_answer(*p) for p in (*GRID, LONG)], "b")
    assert rates.batch_attention_ms == pytest.approx(0.0012, rel=1e-4)
    assert rates.prefill_ms(1000, 0) == pytest.approx(4600.6, rel=1e-4)


def test_a_long_reread_is_forecast_from_the_engines_account_and_the_measured_overhead() -> None:
    rates = measured_rates([engine_answer(*p) for p in POINTS], "b")
    assert rates.prefill_tok_s == pytest.approx(500.0) and rates.attention_ms == pytest.approx(0.01)
    assert rates.overhead_ms == pytest.approx(5.0)  # TTFT less the engine's prompt time
    # 1,000 new tokens after 10 cached: 5 + 1,000 x 2 + 0.01 x 1,000 x 10
    f = forecast(rates, 1010, 10, 1, False)
    assert f.ttft_ms == pytest.approx(2105.0) and f.prefill_ms == pytest.approx(2100.0)
    # a prompt held whole but its last token: one token's cost and its attention
    assert Rates(500.0, None, 1, 0.0, 0.01).prefill_ms(1, 99) == pytest.approx(2 + 0.01 * 99)


def test_a_wait_for_the_model_is_not_priced_as_prefill() -> None:
    # no engine account: TTFT against tokens, 50 ms fixed + 2 ms a token, once the second
    # answer's 40 s wait for the model is left out (with it: 400 ms a token)
    history = [
        metrics_from_dict({"backend": "b", "finish": "stop", **figures})
        for figures in (
            {"evaluated_prompt_tokens": 100, "ttft_ms": 250.0},
            {"evaluated_prompt_tokens": 200, "ttft_ms": 40_450.0, "load_ms": 40_000.0},
        )
    ]
    rates = measured_rates(history, "b")
    assert rates.overhead_ms == pytest.approx(50.0) and rates.prefill_tok_s == pytest.approx(500.0)
    # with the engine's account: its overhead is the TTFT less the load and its time
    # (two of three answers waited: with the wait, the median overhead would be 40 s)
    loaded = [engine_answer(*p, fixed=40_005.0, load_ms=40_000.0) for p in POINTS[1:]]
    rates = measured_rates([engine_answer(*POINTS[0]), *loaded], "b")
    assert rates.overhead_ms == pytest.approx(5.0)
    assert rates.prefill_tok_s == pytest.approx(500.0)
