"""The checks every number from a server passes (backends/remote/wire_numbers.py), at their
bounds: the largest believed and one past it, the kinds of value that are no number."""

from __future__ import annotations

import pytest

from phasechat.backends.remote.wire_numbers import (
    MAX_MS,
    MAX_RATE,
    MAX_RETRY_AFTER_S,
    MAX_TOKENS,
    NOT_JSON,
    Fields,
    as_count,
    as_ms,
    as_rate,
    as_retry_after,
    load_json,
)


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (0, 0),
        (MAX_TOKENS, MAX_TOKENS),
        (MAX_TOKENS + 1, None),
        (-1, None),
        (3.0, 3),  # a float that is a whole number
        (3.5, None),
        (float("inf"), None),
        (float("nan"), None),
        (True, None),
        ("3", None),
        (None, None),
        (10**400, None),
    ],
)
def test_a_count_is_a_whole_number_from_zero_to_the_largest_window(
    value: object, count: int | None
) -> None:
    assert as_count(value) == count


def test_a_count_has_its_own_limit_when_given() -> None:
    assert (as_count(4096, limit=4096), as_count(4097, limit=4096)) == (4096, None)


@pytest.mark.parametrize(
    ("value", "ms"),
    [(0, 0.0), (2, 2.0), (1.5, 1.5), (MAX_MS, MAX_MS), (MAX_MS + 1, None), (-0.1, None),
     (True, None), ("1", None), (10**400, None), (float("nan"), None)],
)  # fmt: skip
def test_a_time_is_milliseconds_from_zero_to_a_week(value: object, ms: float | None) -> None:
    assert as_ms(value) == ms
    assert MAX_MS == 604_800_000.0


def test_rates_and_retry_delays_at_their_bounds() -> None:
    assert [as_rate(v) for v in (0.0, MAX_RATE, MAX_RATE * 1.01, -1.0, None)] == [
        0.0,
        MAX_RATE,
        None,
        None,
        None,
    ]
    assert as_rate(float("inf")) is None
    assert [as_retry_after(v) for v in (-5.0, 2.5, MAX_RETRY_AFTER_S + 1)] == [
        0.0,
        2.5,
        MAX_RETRY_AFTER_S,
    ]
    assert as_retry_after(float("nan")) is None


def test_fields_name_each_value_ignored_in_one_notice() -> None:
    f = Fields()
    obj: dict[str, object] = {"a": 5, "b": -1, "c": "x" * 100, "d": 10**12, "e": [1], "t": 2.0}
    assert f.count(obj, "a", "usage") == 5
    assert f.count(obj, "missing", "usage") is None  # absent: not noted
    assert f.notice("srv") is None
    assert f.count(obj, "b", "usage") is None
    assert f.count(obj, "c", "usage") is None
    assert f.count(obj, "d", "usage") is None
    assert f.count(obj, "e", "usage") is None
    assert f.ms(obj, "t", "timings") == 2.0
    assert f.at_most(7, 5, "cached", "prompt") is None
    assert f.at_most(5, 5, "cached", "prompt") == 5  # equal is no contradiction
    assert f.at_most(5, None, "cached", "prompt") == 5
    assert f.notice("srv") == (
        "ignored usage.b (-1), usage.c ('" + "x" * 40 + "'), usage.d (a 13-digit number), "
        "usage.e (a list), cached (7 > prompt 5) from srv: not a plausible value"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (10**12 - 1, "999999999999"),
        (-(10**12), "a 13-digit number"),
        (10**4000, "a 4001-digit number"),
        (99 * 10**20, "a 22-digit number"),  # 9.9 x 10^21
        (10**21, "a 22-digit number"),
    ],
)
def test_a_long_number_is_shown_by_its_digits(value: int, shown: str) -> None:
    f = Fields()
    f.ignore("x", value)
    assert f.ignored == [f"x ({shown})"]


def test_json_that_is_not_json_or_nests_too_deep_is_not_json() -> None:
    assert load_json('{"a": 1}') == {"a": 1}
    assert load_json("null") is None
    assert load_json("{") is NOT_JSON
    assert load_json("[" * 200_000) is NOT_JSON
    assert load_json("1" * 5000) is NOT_JSON  # an integer too long to convert
