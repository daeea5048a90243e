"""A metric set as small records (telemetry/metric_set.py): each figure declared once, in
its record, and read under its flat name through a view of that one field; stored flat,
in the order it was stored before the records."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from phasechat.telemetry.metric_set import (
    Metrics,
    TimingFigures,
    _View,
    flat_names,
    metrics_from_dict,
    of_flat,
    records,
)


def every_figure() -> dict[str, object]:
    """Each stored figure a value of its own (so a view that read another shows it)."""
    values: dict[str, object] = {}
    for i, name in enumerate(flat_names()):
        values[name] = f"{name}!" if name != "warnings" else (f"w{i}",)
    return values


def test_metrics_holds_six_records_and_its_own_four_figures() -> None:
    assert [f.name for f in fields(Metrics)] == [
        "backend", "model", "finish", "timing", "tokens", "server", "kv", "cpu", "draft",
        "warnings", "ignored",
    ]  # fmt: skip
    assert [attr for attr, _ in records()] == ["timing", "tokens", "server", "kv", "cpu", "draft"]


def test_each_flat_name_reads_its_own_field_of_its_own_record_and_no_other() -> None:
    m = of_flat(every_figure())
    assert m.ignored == () and (m.backend, m.warnings) == ("backend!", ("w75",))
    owner: dict[str, str] = {}
    for attr, cls in records():
        for f in fields(cls):
            assert f.name not in owner, f"{f.name} is declared in {owner[f.name]} and {attr}"
            owner[f.name] = attr
            assert getattr(getattr(m, attr), f.name) == f"{f.name}!"
            assert getattr(m, f.name) == f"{f.name}!"  # the view, not a copy
    # every record field is stored under its flat name, and nothing else is
    assert sorted(owner) == sorted(set(flat_names()) - {"backend", "model", "finish", "warnings"})
    assert (
        isinstance(vars(Metrics)["ttft_ms"], _View) and Metrics.ttft_ms is vars(Metrics)["ttft_ms"]
    )


def test_a_view_named_for_one_figure_that_reads_another_is_refused() -> None:
    # Python 3.11 wraps an error of __set_name__ in a RuntimeError (3.12 raises it)
    with pytest.raises((RuntimeError, TypeError)) as caught:

        @dataclass(frozen=True)
        class Misread:
            timing: TimingFigures
            ttft_ms = _View(lambda m: m.timing.e2e_ms)

    why = caught.value.__cause__ or caught.value
    assert isinstance(why, TypeError) and str(why) == "the view ttft_ms reads timing.e2e_ms"

    @dataclass(frozen=True)
    class Read:
        timing: TimingFigures
        ttft_ms = _View(lambda m: m.timing.ttft_ms)

    assert vars(Read)["ttft_ms"].name == "ttft_ms"  # the name flat_names() lists it by


def test_the_ready_ttft_is_derived_not_stored() -> None:
    m = metrics_from_dict({"ttft_ms": 30.0, "load_ms": 12.5})
    assert m.ttft_ready_ms == m.timing.ttft_ready_ms == 17.5
    assert "ttft_ready_ms" not in flat_names() and "ttft_ready_ms" not in m.as_dict()


def test_stored_flat_in_the_order_it_was_stored_before_the_records() -> None:
    names = flat_names()
    assert len(names) == 76 and len(set(names)) == 76
    assert names[:8] == (
        "backend", "model", "finish", "ttft_ms", "ttfo_ms", "e2e_ms", "first_byte_ms",
        "prompt_tokens",
    )  # fmt: skip
    assert names[-3:] == ("cpus", "decode_unknown", "warnings")
    m = metrics_from_dict({"ttft_ms": 12.5, "output_tokens": 3, "cpus": 4})
    d = m.as_dict()
    assert list(d) == list(names) and "ignored" not in d
    assert (d["ttft_ms"], d["output_tokens"], d["cpus"], d["warnings"]) == (12.5, 3, 4, [])
    assert metrics_from_dict(d) == m
    flagged = metrics_from_dict({**d, "ignored": ["e2e_ms (nan)"]})
    assert flagged.as_dict()["ignored"] == ["e2e_ms (nan)"] and flagged.ignored == ("e2e_ms (nan)",)
