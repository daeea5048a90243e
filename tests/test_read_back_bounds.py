"""Issue 49: a stored metric set read back (telemetry/read_back.py), each figure at its
bound and one past it: a share at 1 and above it (a draft acceptance of 1.5 is not
150%), a byte count of 4 GB in a field whose name does not end in "bytes", and a
petabyte."""

from __future__ import annotations

from typing import Any

import pytest

from phasechat.telemetry.read_back import MAX_BYTES, metrics_read_back

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
