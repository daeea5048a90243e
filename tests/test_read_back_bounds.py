"""Issue 49: a stored metric set read back (telemetry/read_back.py), each figure at its
bound and one past it: a share at 1 and above it (a draft acceptance of 1.5 is not
150%), a byte count of 4 GB in a field whose name does not end in "bytes", and a
petabyte."""

from __future__ import annotations

from typing import Any

import pytest

from phasechat.backends.wire_numbers import MAX_MS, MAX_RATE
from phasechat.telemetry.read_back import (
    MAX_BYTES,
    MAX_CHARS_PER_TOKEN,
    MAX_GB_S,
    Unreadable,
    metrics_read_back,
)

BASE = {"output_tokens": 5, "chars": 20}


def read(**figures: Any) -> Any:
    return metrics_read_back({**BASE, **figures})


@pytest.mark.parametrize("name", ["draft_acceptance", "prefill_share", "server_kv_hit_share"])
def test_a_share_is_believed_up_to_one_and_not_past_it(name: str) -> None:
    for value in (0.0, 1.0):
        m = read(**{name: value})
        assert getattr(m, name) == value and m.ignored == ()
    m = read(**{name: 1.5})
    assert getattr(m, name) is None and m.ignored == (f"{name} (1.5)",)
    assert read(**{name: -0.01}).ignored == (f"{name} (-0.01)",)


@pytest.mark.parametrize("name", ["gpu_bytes_per_token", "cpu_bytes_per_token", "kv_bytes"])
def test_a_byte_count_is_bounded_by_a_petabyte_wherever_bytes_is_in_its_name(name: str) -> None:
    four_gb = 4 * 1024**3  # more than a token count may be (16 Mi)
    assert getattr(read(**{name: four_gb}), name) == four_gb
    assert getattr(read(**{name: MAX_BYTES}), name) == MAX_BYTES
    past = read(**{name: MAX_BYTES + 1})
    assert getattr(past, name) is None and past.ignored == (f"{name} (a number too large)",)


def test_a_token_count_is_bounded_by_a_token_count() -> None:
    m = read(prompt_tokens=4 * 1024**3)
    assert m.prompt_tokens is None and len(m.ignored) == 1


@pytest.mark.parametrize(
    ("name", "top"),
    [
        ("ttft_ms", MAX_MS),  # a time: a week at most
        ("itl_ms_max", MAX_MS),
        ("decode_tok_s", MAX_RATE),  # a rate: belief's limit
        ("chars_per_s", MAX_RATE),
        ("implied_bandwidth_gb_s", MAX_GB_S),
        ("chars_per_token", MAX_CHARS_PER_TOKEN),
    ],
)
def test_each_kind_of_float_is_bounded_by_what_it_measures(name: str, top: float) -> None:
    assert getattr(read(**{name: top}), name) == top
    assert getattr(read(**{name: 0}), name) == 0.0
    for bad in (top * 1.01, -1.0, "1.0", True):
        m = read(**{name: bad})
        assert getattr(m, name) is None and len(m.ignored) == 1 and m.ignored[0].startswith(name)


def test_flags_text_and_warnings_are_what_they_say_or_unknown() -> None:
    m = read(cache_reported=True, backend="b", warnings=["slow", "hot"], finish=None)
    assert (m.cache_reported, m.backend, m.warnings, m.finish) == (True, "b", ("slow", "hot"), None)
    bad = read(cache_reported=1, backend=7, warnings=["ok", 3])
    # named in the fields' order
    assert bad.ignored == ("backend (7)", "cache_reported (1)", "warnings (a list)")
    assert bad.backend == "" and bad.warnings == ()
    # a required figure that is null is unknown; an optional one's null is None, kept
    assert read(output_tokens=3, prompt_tokens=None).ignored == ()
    with pytest.raises(Unreadable, match="output_tokens is None, not a count"):
        read(output_tokens=None)
    with pytest.raises(Unreadable, match=r"chars is 2\.5, not a count"):
        read(chars=2.5)
    with pytest.raises(Unreadable, match="not an object"):
        metrics_read_back([1, 2])
    assert read(unknown_field=5).ignored == ()  # another version's field: left out
