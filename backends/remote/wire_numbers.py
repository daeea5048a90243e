"""Every number a server sends, checked once, where its JSON is read.

A count of tokens is a finite, non-negative integer no larger than any context window
(`MAX_TOKENS`); a time is a finite, non-negative number of milliseconds no longer than a
week; relations that physics imposes hold (cached <= prompt, accepted <= drafted,
reasoning <= completion). A value that fails is unknown (None), never shown as fact, and
`Fields` collects its name so the caller can say, in one notice, which field of which
server was ignored.

The JSON itself is read here too (`load_json`): a body nested 200,000 deep raises
RecursionError, not ValueError, and must be as harmless as any other bad body.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from phasechat.backends.events import Message

#: The largest window (and so the largest count of tokens in one request) believed:
#: 16 Mi tokens, beyond any model served today by an order of magnitude.
MAX_TOKENS = 16 * 1024 * 1024
#: The longest server-reported time believed, in milliseconds: a week.
MAX_MS = 7 * 24 * 3600 * 1000.0
#: The longest Retry-After honoured, in seconds (longer: this long).
MAX_RETRY_AFTER_S = 3600.0
#: The fastest rate believed, in tokens a second (prefill on the largest GPUs is ~1e5).
MAX_RATE = 10_000_000.0

#: The tokens a chat template adds around each message and to the whole prompt (role
#: headers, a default system prompt), taken generously: a bound, not an estimate.
TEMPLATE_PER_MESSAGE = 256
TEMPLATE_TOKENS = 4096

T = TypeVar("T", int, float)

#: `load_json`'s answer for a body that is not JSON (None is valid JSON: `null`).
NOT_JSON = object()


def load_json(body: str | bytes) -> object:
    """The JSON value of `body`, or `NOT_JSON` when it is not JSON, nests too deep, or
    holds an integer too long to convert."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return NOT_JSON


def prompt_bound(messages: Iterable[Message]) -> int:
    """The most tokens `messages` can be as a prompt, whatever the tokenizer: a token of
    text holds at least one byte, and the template adds its own (generously counted).
    A server that counts more read something else."""
    size = count = 0
    for m in messages:
        size += len(m.content.encode("utf-8", "surrogatepass"))
        count += 1
    return size + TEMPLATE_PER_MESSAGE * count + TEMPLATE_TOKENS


def as_count(value: object, limit: int = MAX_TOKENS) -> int | None:
    """`value` as a count in 0..`limit`, or None (a string, a bool, NaN, a fraction,
    a negative or an absurd number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= limit:
        return value
    return None


def as_ms(value: object) -> float | None:
    """`value` as a time in milliseconds in 0..`MAX_MS`, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # compared before any conversion: an int of 400 digits overflows float()
    return float(value) if 0 <= value <= MAX_MS else None


def as_rate(value: float | None) -> float | None:
    """A rate in tokens a second, or None when negative, not finite or beyond belief."""
    if value is None or not math.isfinite(value) or not 0 <= value <= MAX_RATE:
        return None
    return value


def as_retry_after(seconds: float) -> float | None:
    """A Retry-After delay: None when not a finite number, else in 0..`MAX_RETRY_AFTER_S`."""
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


@dataclass
class Fields:
    """Reads the numbers of one JSON object, remembering which were ignored."""

    ignored: list[str] = field(default_factory=list)

    def count(self, obj: dict[str, object], key: str, where: str) -> int | None:
        """`obj[key]` as a count; None when absent, or (noted) when not a plausible one."""
        return self._read(obj, key, where, as_count)

    def ms(self, obj: dict[str, object], key: str, where: str) -> float | None:
        """`obj[key]` as milliseconds; None when absent, or (noted) when not plausible."""
        return self._read(obj, key, where, as_ms)

    def _read(
        self, obj: dict[str, object], key: str, where: str, check: Callable[[object], T | None]
    ) -> T | None:
        value = obj.get(key)
        checked = check(value)
        if value is not None and checked is None:
            self.ignore(f"{where}.{key}", value)
        return checked

    def at_most(self, small: int | None, large: int | None, name: str, bound: str) -> int | None:
        """`small`, or None (noted) when it exceeds `large`: a part larger than its whole."""
        if small is not None and large is not None and small > large:
            self.ignored.append(f"{name} ({small:,} > {bound} {large:,})")
            return None
        return small

    def ignore(self, name: str, value: object) -> None:
        """Note field `name`, whose `value` was not believed."""
        self.ignored.append(f"{name} ({_shown(value)})")

    def notice(self, server: str) -> str | None:
        """One line naming every ignored field and `server`, or None when none was."""
        if not self.ignored:
            return None
        return f"ignored {', '.join(self.ignored)} from {server}: not a plausible value"


def _shown(value: object) -> str:
    """`value` in a few characters: never the whole of a long string, nor the repr of
    a container (one nested 900 deep would exceed the recursion limit)."""
    if isinstance(value, int) and abs(value) >= 10**12:
        return f"a {_digits(value)}-digit number"  # repr() refuses 4,300 digits
    if isinstance(value, str):
        return repr(value[:40])
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "an object"
    return repr(value)[:40]


def _digits(n: int) -> int:
    """How many decimal digits `n` has, without converting it to a string (which
    Python refuses beyond 4,300 digits)."""
    n = abs(n)
    digits = int(n.bit_length() * math.log10(2)) + 1  # right, or one too many
    return digits - 1 if digits > 1 and n < 10 ** (digits - 1) else digits
