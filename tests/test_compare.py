"""Compare's pure logic: spreads, ratios, the noise warning, derived profiles."""

from __future__ import annotations

import asyncio
import re
import statistics
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    Message,
    StreamError,
    TextDelta,
)
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import (
    Answer,
    Comparison,
    MetricRow,
    Side,
    aligned,
    can_run_together,
    cold_messages,
    compare_metrics,
    fmt_cell,
    fmt_ratio,
    fmt_spread,
    greedy,
    metric_value,
    request_for,
    spread_of,
    word_diff,
)
from phasechat.chat.trips.compare_targets import derive, split_name, variants
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.recorder import Trace
from tests.near import near
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


def row(a: Sequence[float | None], b: Sequence[float | None]) -> MetricRow:
    return MetricRow("decode_tok_s", "decode", "tok/s", spread_of(a), spread_of(b))


def test_ratio_is_b_over_a_of_the_medians_and_unknown_stays_unknown() -> None:
    r = row([10.0, 20.0, 30.0], [40.0, 41.0, 42.0])
    assert r.ratio == pytest.approx(41.0 / 20.0)
    assert r.delta == pytest.approx(21.0)
    even = row([10.0, 20.0, 30.0, 40.0], [40.0, 41.0, 42.0, 45.0])  # medians 25 and 41.5
    assert (even.ratio, even.delta) == (near(41.5 / 25.0), near(16.5))
    assert row([None], [5.0]).ratio is None  # prefill hidden by a server: n/a, never 0
    assert row([0.0], [5.0]).ratio is None
    assert fmt_cell(None, "tok/s") == "n/a"


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
    # the KV cache's type (issue 39): another copy of the model, its cache in q4_0
    kv = derive("local", spec, settings, {"kv": "q4_0"})
    assert (kv.name, kv.spec.local.kv_type, kv.own_backend) == ("local(kv=q4_0)", "q4_0", True)
    assert kv.spec.local.flash_attn is None  # turned on at load: a quantized V cache needs it
    with pytest.raises(ValueError, match="kv='q5_1': expected one of f16, q8_0, q4_0"):
        derive("local", spec, settings, {"kv": "q5_1"})
    with pytest.raises(ValueError, match="local model"):
        derive("openai", BackendSpec("openai"), settings, {"kv": "q8_0"})
    # --gpu-layers, the config's gpu_layers and a target's are one name down to LocalConfig
    cpu = derive("local", spec, settings, {"gpu_layers": "0"})
    assert (cpu.spec.local.gpu_layers, spec.local.gpu_layers, cpu.own_backend) == (0, None, True)
    with pytest.raises(ValueError, match="gpu_layers: expected -1"):
        derive("local", spec, settings, {"gpu_layers": "-2"})


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


def pair(
    a: ScriptedBackend, b: ScriptedBackend, *, together: bool = True, cold: bool = False
) -> Comparison:
    sides = (Side("A", a, Settings(temperature=0.0)), Side("B", b, Settings(temperature=0.0)))
    messages = (Message("system", "Be terse."), Message("user", "Hi"))
    return Comparison(*sides, messages, together=together, cold=cold)


async def test_rounds_keep_every_measured_answer_and_the_latest_is_the_newest() -> None:
    c = pair(ScriptedBackend("a", "one two"), ScriptedBackend("b", "three"))
    assert (c.latest(0), c.latest(1)) == (None, None)
    rounds: list[tuple[int, int]] = []
    await c.run(3, warm_up=True, on_round=lambda a, b: rounds.append((a.round, b.round)))
    assert rounds == [(0, 0), (1, 1), (2, 2)] and c.repeat == 3  # the warm-up not kept
    assert [(x.side, x.round) for x in c.answers] == [(s, r) for r in range(3) for s in (0, 1)]
    assert (c.latest(0), c.latest(1)) == (c.answers[4], c.answers[5])
    assert c.of(0) == c.answers[0::2] and c.of(1) == c.answers[1::2]
    assert [x.text.split() for x in c.answers[4:]] == [["one", "two"], ["three"]]
    by_key = {r.key: r for r in c.rows()}
    assert (by_key["output_tokens"].a.n, by_key["output_tokens"].b.n) == (3, 3)


@pytest.mark.parametrize("shared", [False, True])
async def test_a_cold_round_tags_both_sides_alike_unless_they_share_one_engine(
    shared: bool,
) -> None:
    a = ScriptedBackend("a")
    c = pair(a, a if shared else ScriptedBackend("b"), cold=True)
    await c.run(2)
    tags = [x.request.messages[0].content.split("\n")[0] for x in c.answers]
    assert all(re.fullmatch(r"\[[0-9a-f]{8}\]", t) for t in tags)
    assert (tags[0] == tags[1], tags[2] == tags[3]) == (not shared, not shared)
    assert len({tags[0], tags[2]}) == 2  # each round its own
    assert [x.request.messages[1:] for x in c.answers] == [(Message("user", "Hi"),)] * 4


def test_only_answers_that_completed_are_compared() -> None:
    c = pair(ScriptedBackend("a"), ScriptedBackend("b"))
    outcomes: list[tuple[StreamError | None, FinishReason]] = [
        (None, "stop"),
        (None, "cancelled"),
        (StreamError("server", "boom"), "error"),
    ]
    for n, (error, finish) in enumerate(outcomes):
        trace = Trace(backend="a", model="m")
        trace.error, trace.finish = error, finish
        figures = metrics_from_dict({"ttft_ms": 100.0 * (n + 1)})
        c.answers.append(Answer(0, n, trace, request_for(Settings(), c.messages), figures))
    request, fast = c.answers[0].request, metrics_from_dict({"ttft_ms": 50.0})
    c.answers.append(Answer(1, 0, Trace(backend="b", model="m"), request, fast))
    c.answers.append(Answer(1, 1, Trace(backend="b", model="m"), request))  # streaming
    assert [x.complete for x in c.answers] == [True, False, False, True, False]
    assert c.of(1) == [c.answers[3]] and c.of(0) == c.answers[:3]
    ttft = next(r for r in c.rows() if r.key == "ttft_ms")
    assert (ttft.a.n, ttft.a.median, ttft.b.n, ttft.b.median) == (1, 100.0, 1, 50.0)


def test_greedy_needs_temperature_0_and_a_seed_on_both_sides() -> None:
    def c(a: Settings, b: Settings) -> Comparison:
        x = ScriptedBackend("x")
        return Comparison(Side("A", x, a), Side("B", x, b), ())

    fixed = Settings(temperature=0.0, seed=7)
    assert greedy(c(fixed, Settings(temperature=0.0, seed=0)))
    assert not greedy(c(fixed, Settings(temperature=0.0, seed=None)))
    assert not greedy(c(Settings(temperature=0.7, seed=7), fixed))
    assert not greedy(c(fixed, Settings(temperature=0.2, seed=7)))


@pytest.mark.parametrize(
    ("a", "b", "noisy"),
    [
        ([10.0, 20.0, 30.0], [30.0, 40.0, 50.0], False),  # spreads 20, medians 20 apart
        ([30.0, 40.0, 50.0], [10.0, 20.0, 30.0], False),  # the same with B slower
        ([10.0, 20.0, 31.0], [30.0, 40.0, 50.0], True),  # A spreads 21
        ([30.0, 40.0, 50.0], [10.0, 20.0, 31.0], True),  # B spreads 21, B slower
    ],
)
def test_a_spread_as_wide_as_the_difference_still_tells_a_from_b(
    a: list[float], b: list[float], noisy: bool
) -> None:
    assert row(list(a), list(b)).noisy == noisy


def test_the_warning_names_the_wider_sides_spread_and_the_difference() -> None:
    ten = [float(x) for x in (1, 2, 3, 4, 5, 6, 7, 8, 9, 500)]  # p10-p90 1.9 to 58.1
    wide_b = row([20.0, 21.0, 22.0], ten)
    assert wide_b.warning() == (
        "decode: the spread (p10-p90 56.2 tok/s) is wider than the difference "
        "(15.5 tok/s): these runs do not tell A from B"
    )
    wide_a = row([100.0, 300.0, 500.0], [290.0, 310.0])  # min-max 400 wide, 0 apart
    assert wide_a.warning() == (
        "decode: the spread (min-max 400 tok/s) is wider than the difference "
        "(0.0 tok/s): these runs do not tell A from B"
    )
    edge = row([50.0, 150.0], [0.5])  # exactly 100 wide: whole numbers from 100 on
    assert edge.warning() == (
        "decode: the spread (min-max 100 tok/s) is wider than the difference "
        "(99.5 tok/s): these runs do not tell A from B"
    )
    reuse = MetricRow("cache_reuse", "cache reuse", "%", spread_of([0.2, 0.9]), spread_of([0.6]))
    assert reuse.warning() == (
        "cache reuse: the spread (min-max 70%) is wider than the difference (5%): "
        "these runs do not tell A from B"
    )


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (99.94, "ms", "99.9"),
        (100.0, "ms", "100"),
        (1234.6, "ms", "1,235"),
        (-99.5, "ms", "-99.5"),  # a difference B - A: its size picks the decimals
        (-150.4, "ms", "-150"),
        (0.456, "%", "46%"),
    ],
)
def test_figures_under_100_keep_one_decimal(value: float, unit: str, shown: str) -> None:
    assert fmt_cell(value, unit) == shown


def test_a_spread_is_shown_from_two_runs_on() -> None:
    assert fmt_spread(spread_of([12.0]), "ms") == "12.0"
    assert fmt_spread(spread_of([12.0, 250.0]), "ms") == "131 [12.0-250]"
    assert fmt_spread(spread_of([0.25, 0.5, 0.75]), "%") == "50% [25%-75%]"


def test_the_word_diff_marks_what_b_dropped_and_added() -> None:
    assert word_diff("the cat sat", "the dog sat down") == "the [-cat-] {+dog+} sat {+down+}"
    assert word_diff("a b c", "a c") == "a [-b-] c"
    assert word_diff("same  words", "same words") == "same words"


def test_cache_reuse_of_an_empty_prompt_is_unknown_and_counts_are_figures() -> None:
    empty = metrics_from_dict({"prompt_tokens": 0, "cached_tokens": 0, "output_tokens": 7})
    assert metric_value(empty, "cache_reuse") is None
    assert metric_value(empty, "output_tokens") == 7.0
    assert metric_value(empty, "ttft_ms") is None
    for a, b in (([5.0, 7.0], [None]), ([None], [5.0, 7.0])):  # one side never reported it
        assert (row(a, b).delta, row(a, b).noisy, row(a, b).warning()) == (None, False, None)


async def test_a_side_with_a_prompt_variant_sends_its_own_messages() -> None:
    own = (Message("user", "Hi, in French"),)
    a, b = ScriptedBackend("a"), ScriptedBackend("b")
    c = Comparison(Side("A", a, Settings()), Side("B", b, Settings(), own), [Message("user", "Hi")])
    assert c.together and not pair(a, b, together=False).together and not pair(a, a).together
    await c.run()  # one round
    assert [x.request.messages for x in c.answers] == [(Message("user", "Hi"),), own]


class Stuck(ScriptedBackend):
    """Streams one word, then waits until cancelled."""

    def __init__(self) -> None:
        super().__init__("stuck")
        self.streaming = asyncio.Event()

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield TextDelta("partial ")
        self.streaming.set()
        await asyncio.Event().wait()
        yield Finished("stop")


async def test_a_round_cancelled_during_a_finishes_both_answers_as_cancelled() -> None:
    backend = Stuck()
    c = pair(backend, backend)  # one engine: A then B
    run = asyncio.create_task(c.run(2))
    await backend.streaming.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    a, b = c.answers
    assert (a.done, b.done, a.started, b.started) == (True, True, True, False)
    assert (a.text, b.text) == ("partial ", "")
    assert (a.trace.finish, b.trace.finish) == ("cancelled", "cancelled")
    assert not a.complete and not b.complete and c.repeat == 0
    assert all(r.a.n == r.b.n == 0 for r in c.rows())


@pytest.mark.parametrize(
    ("ratio", "shown"),
    [
        (999_999.4, "999,999"),
        (999_999.5, "1.0e+06"),  # would round to 1,000,000: 9 characters
        (-2e6, "-2.0e+06"),  # the size decides, whatever the sign
        (999.995, "1,000"),  # would round to 1000.00
        (1000.6, "1,001"),
        (-1500.0, "-1,500"),
        (0.0046, "<0.01"),
        (0.005, "0.01"),
        (0.5, "0.50"),
    ],
)
def test_a_ratio_changes_its_form_exactly_where_the_rounded_figure_would_not_fit(
    ratio: float, shown: str
) -> None:
    assert fmt_ratio(ratio) == shown


def test_table_columns_are_parted_by_two_spaces_at_least() -> None:
    rows = [["metric", "A"], ["TTFT", "1,234.5"]]
    # too narrow: each column as wide as its widest cell and 2
    assert aligned(rows, [4, 3]) == ["metric" + " " * 10 + "A", "TTFT" + " " * 6 + "1,234.5"]
    assert aligned(rows, [10, 12]) == ["metric" + " " * 15 + "A", "TTFT" + " " * 11 + "1,234.5"]
