"""Each stored figure's bound is declared beside its field (telemetry/bounds.py) and read
back by that declaration (telemetry/read_back.py), never guessed from the field's name:
issue 49's "a real 4 GB gpu_bytes_per_token rejected on reopen" came from a name rule."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from phasechat.telemetry import read_back
from phasechat.telemetry.bounds import MAX_BYTES, MAX_CPUS, Bytes, Count, Ms, Share
from phasechat.telemetry.metric_set import Metrics, flat_names
from phasechat.telemetry.read_back import checks_of, metrics_read_back

FOUR_GB = 4 * 1024**3


@dataclass(frozen=True)
class Misnamed:
    """Names that say one kind and declarations that say another."""

    weights_bytes: Count | None
    tokens: Bytes | None
    wait_share: Ms | None
    time_ms: Share
    label: str


def test_a_bound_follows_the_declaration_not_the_name() -> None:
    checks = checks_of(Misnamed)
    assert list(checks) == ["weights_bytes", "tokens", "wait_share", "time_ms", "label"]
    assert checks["tokens"](FOUR_GB) == FOUR_GB  # bytes, though named tokens
    assert checks["weights_bytes"](FOUR_GB) != FOUR_GB  # a count, though named bytes
    assert checks["weights_bytes"](5) == 5
    assert checks["wait_share"](5_000.0) == 5_000.0  # a time, though named a share
    assert checks["time_ms"](0.5) == 0.5 and checks["time_ms"](2.0) != 2.0
    assert checks["time_ms"](None) is not None  # required: a null is not plausible
    assert checks["tokens"](None) is None and checks["label"]("x") == "x"


def test_a_number_that_declares_no_bound_is_refused_when_the_checks_are_built() -> None:
    @dataclass
    class Undeclared:
        kv_bytes: int | None

    with pytest.raises(TypeError, match="kv_bytes is a number that declares no bound"):
        checks_of(Undeclared)


def test_every_stored_number_of_metrics_declares_its_bound() -> None:
    # every field of each record (Metrics' own fields and its records' fields, each
    # under its flat name), in the order a metric set is stored
    checks = checks_of(Metrics, skip=("ignored",))
    assert sorted(checks) == sorted(flat_names()) and len(flat_names()) == 76
    assert list(read_back._checks()) == list(flat_names())


def test_a_real_4_gb_a_token_reads_back_as_stored() -> None:
    stored = {"output_tokens": 5, "chars": 20, "gpu_bytes_per_token": FOUR_GB}
    back = metrics_read_back({**stored, "cpu_bytes_per_token": MAX_BYTES})
    assert (back.gpu_bytes_per_token, back.cpu_bytes_per_token) == (FOUR_GB, MAX_BYTES)
    assert back.ignored == ()


def test_the_cpus_other_processes_kept_busy_are_bounded_as_cpus() -> None:
    base = {"output_tokens": 5, "chars": 20}
    assert metrics_read_back({**base, "busy_cpus": MAX_CPUS}).busy_cpus == MAX_CPUS
    assert metrics_read_back({**base, "busy_cpus": 0.5}).busy_cpus == 0.5  # half a CPU
    past = metrics_read_back({**base, "busy_cpus": MAX_CPUS * 1.01, "cpus": 1.5})
    assert (past.busy_cpus, past.cpus) == (None, None)
    assert past.ignored == (f"busy_cpus ({MAX_CPUS * 1.01!r})", "cpus (1.5)")
