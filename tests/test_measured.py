"""What both kept measurements share (backends/local/measured.py): the other processes' share
of the CPUs during a measurement (busy, not idle), when it is too busy to keep, the
bounds a number read back must lie in, and a cache file read with suspicion."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.local.measured import (
    BUSY,
    busy,
    ignored,
    others_during,
    read_entries,
    share_text,
    write_entries,
)
from phasechat.backends.local.threads import CpuShare
from phasechat.backends.untrusted import number_in, shown


class IdleShare(CpuShare):
    """A CPU meter whose next reading says the others left `idle` of the CPUs idle."""

    def __init__(self, idle: float | None, order: list[str]) -> None:  # reads no /proc/stat
        self.idle, self.order = idle, order
        order.append("meter started")

    def idle_share(self) -> float | None:
        self.order.append("meter read")
        return self.idle


@pytest.mark.parametrize(
    ("idle", "others"),
    [(0.75, 0.25), (0.125, 0.875), (1.0, 0.0), (1.5, 0.0), (-0.5, 1.0), (None, None)],
)
def test_the_others_share_is_what_they_left_busy(idle: float | None, others: float | None) -> None:
    order: list[str] = []

    def measure() -> str:
        order.append("measured")
        return "result"

    meter = lambda: IdleShare(idle, order)  # noqa: E731
    result, share = others_during(measure, meter)
    assert (result, share) == ("result", others)
    # the meter spans the measurement: started before it, read after it
    assert order == ["meter started", "measured", "meter read"]


def test_a_measurement_is_busy_only_above_a_quarter_of_the_cpus() -> None:
    assert BUSY == 0.25
    assert [busy(x) for x in (None, 0.0, 0.25, 0.2501, 1.0)] == [False, False, False, True, True]
    assert share_text(0.52) == "other processes used 52% of the CPUs"
    assert share_text(0.005) == "other processes used 0% of the CPUs"
    assert share_text(None) == "the other processes' share of the CPUs unknown"


@pytest.mark.parametrize(
    ("value", "got"),
    [
        (1, 1.0),  # the bounds are in
        (10, 10.0),
        (5.5, 5.5),
        (0.999, None),
        (10.001, None),
        (True, None),  # a bool is no number here
        ("5", None),
        (float("nan"), None),
        (float("inf"), None),
        (10**400, None),  # too long for a float: compared as an int, out of bounds
        (None, None),
    ],
)
def test_a_number_read_back_is_finite_and_within_its_bounds(
    value: object, got: float | None
) -> None:
    assert number_in(value, 1, 10) == got


def test_a_value_is_shown_in_a_few_characters() -> None:
    assert shown([1, 2]) == "a list" and shown({"a": 1}) == "an object"
    assert shown(10**12) == "a number too large" and shown(10**12 - 1) == "999999999999"
    assert shown(-(10**12)) == "a number too large"
    assert shown("x" * 100) == "'" + "x" * 39
    assert shown(True) == "True"


def test_a_cache_file_is_read_with_suspicion_and_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "kept.json"
    assert read_entries(path) == ({}, None)  # none yet
    write_entries(path, {"a": {"x": 1}})
    assert read_entries(path) == ({"a": {"x": 1}}, None)
    assert not path.with_suffix(".tmp").exists()
    path.write_text("[1, 2]")
    assert read_entries(path) == ({}, "a JSON list, not an object of entries")
    path.write_bytes(b'{"a": \xff')
    assert read_entries(path) == ({}, "not JSON (truncated or damaged)")
    path.write_text("[" * 100_000)
    assert read_entries(path) == ({}, "not JSON (truncated or damaged)")
    assert ignored(path, "why") == f"ignored {path}: why; measured again"
