"""Compare's pure logic: spreads, ratios, the noise warning, derived profiles."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from phasechat.backends.events import Message
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import (
    MetricRow,
    can_run_together,
    cold_messages,
    compare_metrics,
    fmt,
    fmt_spread,
    metric_value,
    spread_of,
)
from phasechat.chat.trips.compare_targets import derive, split_name, variants
from phasechat.telemetry.metrics import metrics_from_dict
from tests.scripted import ScriptedBackend


def test_spread_is_min_max_below_ten_runs_and_p10_p90_from_ten() -> None:
    few = spread_of([3.0, 1.0, None, 2.0])
    assert (few.n, few.median, few.lo, few.hi, few.kind) == (3, 2.0, 1.0, 3.0, "min-max")
    many = spread_of([float(x) for x in range(1, 12)])  # 1..11
    assert many.kind == "p10-p90" and many.median == 6.0
    assert (many.lo, many.hi) == (2.0, 10.0)  # an outlier at either end no longer sets it
    none = spread_of([None, None])
    assert none.n == 0 and none.median is None and fmt_spread(none, "ms") == "n/a"


def test_an_even_count_has_the_mean_of_the_middle_two_as_its_median() -> None:
    values = [4.0, 1.0, 3.0, 10.0]
    four = spread_of(values)
    assert four.median == statistics.median(values) == 3.5
    assert (four.n, four.lo, four.hi, four.kind) == (4, 1.0, 10.0, "min-max")
    six = spread_of([7.0, 2.0, None, 5.0, 11.0, 3.0, 40.0])
    assert six.n == 6 and six.median == statistics.median([7.0, 2.0, 5.0, 11.0, 3.0, 40.0])


@pytest.mark.parametrize("n", [9, 10, 11, 12])
def test_the_spread_is_numpys_p10_p90_from_exactly_ten_runs(n: int) -> None:
    values = [3.0, 41.0, 7.0, 12.0, 5.0, 30.0, 9.0, 18.0, 2.0, 25.0, 60.0, 1.0][:n]
    s = spread_of(values)
    assert s.median == pytest.approx(float(np.median(values)))
    if n >= 10:
        assert s.kind == "p10-p90"
        assert s.lo == pytest.approx(float(np.percentile(values, 10)))
        assert s.hi == pytest.approx(float(np.percentile(values, 90)))
    else:
        assert (s.kind, s.lo, s.hi) == ("min-max", min(values), max(values))


def row(a: list[float | None], b: list[float | None]) -> MetricRow:
    return MetricRow("decode_tok_s", "decode", "tok/s", spread_of(a), spread_of(b))


def test_ratio_is_b_over_a_of_the_medians_and_unknown_stays_unknown() -> None:
    r = row([10.0, 20.0, 30.0], [40.0, 41.0, 42.0])
    assert r.ratio == pytest.approx(41.0 / 20.0)
    assert r.delta == pytest.approx(21.0)
    even = row([10.0, 20.0, 30.0, 40.0], [40.0, 41.0, 42.0, 45.0])  # medians 25 and 41.5
    assert (even.ratio, even.delta) == (pytest.approx(41.5 / 25.0), pytest.approx(16.5))
    assert row([None], [5.0]).ratio is None  # prefill hidden by a server: n/a, never 0
    assert row([0.0], [5.0]).ratio is None
    assert fmt(None, "tok/s") == "n/a"


def test_warning_when_the_spread_is_wider_than_the_difference() -> None:
    wide = row([10.0, 20.0, 30.0], [22.0, 23.0, 24.0])  # A spreads 20, the medians differ by 3
    assert wide.noisy
    warning = wide.warning()
    assert warning is not None and "wider than the difference" in warning and "min-max" in warning
    clear = row([10.0, 11.0, 12.0], [30.0, 31.0, 32.0])  # spreads 2, difference 20
    assert not clear.noisy and clear.warning() is None
    one_run = row([10.0], [11.0])  # no spread measured: nothing to warn about
    assert not one_run.noisy


def test_cache_reuse_is_cached_over_prompt_and_unknown_when_not_reported() -> None:
    base = {"backend": "x", "model": "m", "prompt_tokens": 40}
    assert metric_value(metrics_from_dict({**base, "cached_tokens": 30}), "cache_reuse") == 0.75
    # over the whole prompt, not over what was evaluated (30 / 10 would be 300%)
    counted = {**base, "cached_tokens": 30, "evaluated_prompt_tokens": 10}
    assert metric_value(metrics_from_dict(counted), "cache_reuse") == 0.75
    assert metric_value(metrics_from_dict(base), "cache_reuse") is None
    rows = compare_metrics(
        [metrics_from_dict({**base, "cached_tokens": 0, "ttft_ms": 100.0})],
        [metrics_from_dict({**base, "ttft_ms": 50.0})],
    )
    by_key = {r.key: r for r in rows}
    assert by_key["ttft_ms"].ratio == 0.5
    assert by_key["cache_reuse"].b.median is None and by_key["cache_reuse"].ratio is None


def test_cold_messages_change_only_the_first_line_of_the_first_message() -> None:
    messages = (Message("system", "Be terse."), Message("user", "Hi"))
    cold = cold_messages(messages, "ab12")
    assert cold[0] == Message("system", "[ab12]\nBe terse.") and cold[1] == messages[1]
    assert cold_messages((), "x") == ()


def test_backends_stream_together_only_when_neither_is_serial_and_they_differ() -> None:
    a, b = ScriptedBackend("a"), ScriptedBackend("b")
    assert can_run_together(a, b)
    assert not can_run_together(a, a)
    b.serial = True
    assert not can_run_together(a, b)


def test_derived_profiles_from_the_command_line() -> None:
    assert split_name("local") == ("local", {})
    assert split_name("local:threads=1, flash_attn=off") == (
        "local",
        {"threads": "1", "flash_attn": "off"},
    )
    with pytest.raises(ValueError, match="key=value"):
        split_name("local:threads")
    spec, settings = BackendSpec(), Settings(temperature=0.7)
    t = derive("local", spec, settings, {"threads": "1", "flash_attn": "off"})
    assert t.name == "local(threads=1,flash_attn=off)" and t.own_backend
    assert t.spec.local.threads == 1 and t.spec.local.flash_attn is False
    assert t.spec.name == t.name  # its answers are labelled as the derived profile
    temp = derive("local", spec, settings, {"temperature": "0"})
    assert temp.settings.temperature == 0 and temp.spec == spec and not temp.own_backend
    with pytest.raises(ValueError, match="unknown setting"):
        derive("local", spec, settings, {"colour": "red"})
    with pytest.raises(ValueError, match="local model"):
        derive("openai", BackendSpec("openai"), settings, {"threads": "2"})
    with pytest.raises(ValueError, match="temperature"):
        derive("local", spec, settings, {"temperature": "99"})
    with pytest.raises(ValueError, match="on or off"):
        derive("local", spec, settings, {"flash_attn": "maybe"})


def test_the_picker_offers_settings_that_differ_from_the_current_ones() -> None:
    local = variants(BackendSpec(), Settings(temperature=0))
    assert {"temperature": "0.8"} in local and {"flash_attn": "off"} in local
    remote = variants(BackendSpec("openai"), Settings(temperature=0.7))
    assert remote == [{"temperature": "0"}]  # load settings only exist for a local model


def test_a_slower_b_outside_the_spread_is_not_noisy() -> None:
    # B's median 50 is 50 below A's 100; each side's min-max is 2 wide: the runs tell A from B
    a, b = spread_of([101.0, 99.0, 100.0]), spread_of([51.0, 49.0, 50.0])
    row = MetricRow("decode_tok_s", "decode", "tok/s", a, b)
    assert row.delta == -50.0 and row.a.width == 2.0
    assert not row.noisy and row.warning() is None
