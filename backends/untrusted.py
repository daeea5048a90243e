"""Values read from outside this process (a cache file, the chat database, a server's
JSON), checked before they are believed: a number within its bounds, text that can be
written out (refused, or its lone surrogates replaced), and a bad value shown in a few
characters for the notice that names it."""

from __future__ import annotations

import math
import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def number_in(value: object, low: float, high: float) -> float | None:
    """`value` as a finite float in [low, high], or None (a string, a bool, NaN, inf, an
    integer too long for a float, or out of bounds)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(value) if low <= value <= high else None  # compared before float()


def text_in(value: object) -> str | None:
    """`value` as text that can be written out, or None: not a str, or one holding a
    lone surrogate (JSON can carry `"\\ud800"`; bytes that were not UTF-8 decode to
    them with `surrogateescape`), which no UTF-8 file, database or terminal takes."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def as_text(value: object) -> str:
    """Text from the wire as a str that can be printed, stored and encoded: JSON may
    carry a lone surrogate (`"\\ud800"`), which no UTF-8 stream accepts. Where `text_in`
    refuses such a value, this keeps it with each surrogate replaced (U+FFFD): what every
    reader of a server's JSON does to a string before it is printed, stored or encoded."""
    text = value if isinstance(value, str) else str(value)
    return _SURROGATE.sub("\ufffd", text)


def shown(value: object) -> str:
    """A value read from a cache file, in a few characters for a notice."""
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "an object"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**12:
        return "a number too large"  # repr() refuses 4,300 digits
    return repr(value)[:40]
