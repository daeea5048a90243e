"""What a stored figure may be, declared beside it: the kinds of number a `Metrics`
field is typed with (`Ms`, `Bytes`, `Share`, ...), each an `Annotated` type carrying its
`Bound`.

telemetry/read_back.py checks a value read back from disk against its field's declared
bound, never against a guess from its name (issue 49: a 4 GB `gpu_bytes_per_token` was
bounded as a token count by a name rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from phasechat.backends.remote.wire_numbers import MAX_TOKENS, as_count, as_ms, as_rate
from phasechat.backends.untrusted import number_in

#: The most bytes a decode step (or a KV cache) is believed to read: a petabyte.
MAX_BYTES = 2**50
#: The highest bandwidth believed, in GB/s (HBM3e is ~5,000), and characters per token.
MAX_GB_S = 1e6
MAX_CHARS_PER_TOKEN = 1e4
#: The most CPUs' worth of work believed of a machine's other processes.
MAX_CPUS = 1e4


@dataclass(frozen=True, slots=True)
class Bound:
    """What a figure of one kind may be: `check` gives a plausible value back (a float
    for a time, a rate or a share) and None for anything else (a string, a bool, NaN,
    a negative, a number past the kind's limit)."""

    check: Callable[[object], int | float | None]


def _count(v: object) -> int | None:
    return as_count(v, MAX_TOKENS)


def _bytes(v: object) -> int | None:
    return as_count(v, MAX_BYTES)


def _rate(v: object) -> float | None:
    return as_rate(number_in(v, 0.0, float("inf")))


def _share(v: object) -> float | None:
    return number_in(v, 0.0, 1.0)


def _gb_s(v: object) -> float | None:
    return number_in(v, 0.0, MAX_GB_S)


def _per_token(v: object) -> float | None:
    return number_in(v, 0.0, MAX_CHARS_PER_TOKEN)


def _cpus(v: object) -> float | None:
    return number_in(v, 0.0, MAX_CPUS)


COUNT = Bound(_count)  # tokens, threads, CPUs, characters
BYTES = Bound(_bytes)
MS = Bound(as_ms)  # a week at most
RATE = Bound(_rate)  # tokens or characters a second
SHARE = Bound(_share)  # 0-1
GB_S = Bound(_gb_s)
PER_TOKEN = Bound(_per_token)  # characters per token
CPUS = Bound(_cpus)  # CPUs' worth of work

Count = Annotated[int, COUNT]
Bytes = Annotated[int, BYTES]
Ms = Annotated[float, MS]
Rate = Annotated[float, RATE]
Share = Annotated[float, SHARE]
GbS = Annotated[float, GB_S]
PerToken = Annotated[float, PER_TOKEN]
Cpus = Annotated[float, CPUS]
