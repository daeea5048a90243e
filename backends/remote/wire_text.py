"""Text from the wire, made safe to keep: what every reader of a server's JSON does to a
string before it is printed, stored or encoded."""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def as_text(value: object) -> str:
    """Text from the wire as a str that can be printed, stored and encoded: JSON may
    carry a lone surrogate (`"\\ud800"`), which no UTF-8 stream accepts."""
    text = value if isinstance(value, str) else str(value)
    return _SURROGATE.sub("\ufffd", text)
