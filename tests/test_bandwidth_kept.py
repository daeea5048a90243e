"""This machine's memory bandwidth on disk is the best ever seen, measured on a quiet
machine, and checked when read (chat/roofline.py): a busy probe is not kept, a lower
one never replaces a higher one, a tampered entry is ignored with a notice naming the
file. Fake probes with set figures and load readings: no timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasechat.chat import roofline
from phasechat.chat.roofline import Bandwidth, machine_bandwidth, machine_key
from phasechat.cli.commands import doctor
from phasechat.telemetry.membw import Probed
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.verdict import roofline as roofline_text

QUIET = Probed(36.0, 2, 0.02)
BUSY = Probed(14.3, 2, 0.6)  # the defect: probed beside a compiler


class Fake:
    """A probe that returns set figures and counts its calls."""

    def __init__(self, *probes: Probed) -> None:
        self.probes = list(probes)
        self.calls = 0

    def __call__(self) -> Probed:
        self.calls += 1
        return self.probes.pop(0)


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache file of its own, and a run with no busy probe remembered yet."""
    monkeypatch.setattr(roofline, "_THIS_RUN", {})
    return tmp_path / "bandwidth.json"


def kept(path: Path) -> dict[str, object]:
    entry: dict[str, object] = json.loads(path.read_text())[machine_key()]
    return entry


def test_a_busy_probe_serves_this_run_but_is_not_kept(path: Path) -> None:
    probe = Fake(BUSY, QUIET)
    first = machine_bandwidth(path, probe)
    assert (first.gb_s, first.busy, first.cached) == (14.3, True, False)
    assert not path.exists()  # not the fact
    assert machine_bandwidth(path, probe) == first and probe.calls == 1  # this run: once
    roofline._THIS_RUN.clear()  # the next run probes again, on a quiet machine
    later = machine_bandwidth(path, probe)
    assert (later.gb_s, later.busy, probe.calls) == (36.0, False, 2)
    assert kept(path)["gb_s"] == 36.0


def test_the_best_bandwidth_ever_seen_is_kept(path: Path) -> None:
    """Contention only lowers a bandwidth: a lower probe, quiet or busy, never replaces
    the kept figure; a higher one does. (`fresh`: doctor probes every time.)"""
    machine_bandwidth(path, Fake(QUIET))
    lower = machine_bandwidth(path, Fake(Probed(30.0, 2, 0.0)), fresh=True)
    assert (lower.gb_s, lower.cached, lower.probed) == (36.0, True, Probed(30.0, 2, 0.0))
    busy = machine_bandwidth(path, Fake(BUSY), fresh=True)
    assert (busy.gb_s, busy.busy, busy.probed) == (36.0, False, BUSY)
    assert kept(path)["gb_s"] == 36.0
    higher = machine_bandwidth(path, Fake(Probed(38.5, 2, 0.01)), fresh=True)
    assert (higher.gb_s, higher.cached, higher.probed) == (38.5, False, None)
    assert kept(path)["gb_s"] == 38.5
    assert machine_bandwidth(path, Fake()).gb_s == 38.5  # read, not probed


def test_a_one_core_entry_from_before_is_probed_again_and_kept_if_higher(path: Path) -> None:
    """The entry this machine held: 14.3 GB/s, one core, the load not noted."""
    legacy = {"gb_s": 14.3, "measured_at": 1_750_000_000.0}
    path.write_text(json.dumps({machine_key(): legacy}))
    assert roofline.cached_bandwidth(path) is None  # not final: probed again
    assert machine_bandwidth(path, Fake(QUIET)).gb_s == 36.0
    assert kept(path)["threads"] == 2
    path.write_text(json.dumps({machine_key(): legacy}))
    low = machine_bandwidth(path, Fake(Probed(12.0, 2, 0.0)))
    assert (low.gb_s, low.threads) == (14.3, 1)  # the higher one stays, now final
    assert machine_bandwidth(path, Fake()).gb_s == 14.3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gb_s", -5),  # was: "decode runs at -110% of what memory allows"
        ("gb_s", float("nan")),  # was: "nan%"
        ("gb_s", 1e308),  # was: "0%"
        ("gb_s", 0),
        ("gb_s", "fast"),
        ("gb_s", 10**400),  # OverflowError in float()
        ("measured_at", 12345),
        ("measured_at", float("inf")),
        ("threads", 0),
        ("others", 7),
    ],
)
def test_a_tampered_entry_is_ignored_with_a_notice_naming_the_file(
    path: Path, field: str, value: object
) -> None:
    good = {"gb_s": 30.0, "measured_at": 1_750_000_000.0, "threads": 2, "others": 0.0}
    path.write_text(json.dumps({machine_key(): {**good, field: value}}))
    probe = Fake(QUIET)
    bw = machine_bandwidth(path, probe)
    assert probe.calls == 1 and bw.gb_s == 36.0  # probed again, and kept
    assert bw.notice is not None and str(path) in bw.notice and field in bw.notice
    assert bw.notice.startswith("ignored ") and bw.notice.endswith("measured again")
    assert kept(path)["gb_s"] == 36.0
    m = metrics_from_dict({"backend": "local", "model": "m", "implied_bandwidth_gb_s": 5.0})
    assert roofline_text(m, bw.gb_s).endswith("(5.0 of 36.0 GB/s)")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[36.0]", "a JSON list"),
        ('{"abc": {"gb_s": 3', "not JSON"),
        ("null", "a JSON NoneType"),
        (json.dumps({"key": 1}).replace("key", "{key}"), "not an object"),
    ],
)
def test_a_damaged_file_is_ignored_with_a_notice_naming_it(path: Path, text: str, why: str) -> None:
    path.write_text(text.replace("{key}", machine_key()))
    bw = machine_bandwidth(path, Fake(QUIET))
    assert bw.notice is not None and str(path) in bw.notice and why in bw.notice
    assert kept(path)["gb_s"] == 36.0


def test_the_roofline_never_divides_by_a_bandwidth_that_is_not_one() -> None:
    m = metrics_from_dict({"backend": "local", "model": "m", "implied_bandwidth_gb_s": 5.0})
    for bad in (float("nan"), -5.0, 0.0, float("inf")):
        assert "not measured" in roofline_text(m, bad)
    labelled = roofline_text(m, 14.3, "probed on a busy machine, not kept")
    assert labelled.endswith("(5.0 of 14.3 GB/s, probed on a busy machine, not kept)")


def test_doctor_says_which_copy_it_measured_and_what_it_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    best = Bandwidth(36.0, 1_750_000_000.0, True, 2, 0.02, probed=BUSY)
    monkeypatch.setattr(doctor, "machine_bandwidth", lambda fresh: best)
    line, probe = doctor.bandwidth_line().splitlines()
    assert line.startswith("memory bandwidth  36.0 GB/s (2 threads copying 128 MiB at once")
    assert "all cores, summed" in line and "best kept" in line and "used 2% of" in line
    assert "this probe" in probe and "14.3 GB/s" in probe and "60% of the CPUs" in probe
    assert "not kept: busy" in probe
    alone = Bandwidth(14.3, 1_750_000_000.0, False, 2, 0.6, notice="ignored /x: bad")
    monkeypatch.setattr(doctor, "machine_bandwidth", lambda fresh: alone)
    line, notice = doctor.bandwidth_line().splitlines()
    assert "probed now" in line and "for this run only, not kept: busy" in line
    assert notice.strip() == "ignored /x: bad"
