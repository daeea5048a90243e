"""Model output is data, never markup or terminal control.

Terminal escape sequences (ANSI colours, OSC title changes, hyperlinks, OSC 52 clipboard
writes) and other control characters are made visible instead of interpreted, before
text reaches a terminal, a widget or an export.
"""

from __future__ import annotations

import re

# C0 controls except TAB and LF, DEL, and the C1 block (which some terminals honour).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode "control picture": ESC -> ␛
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{code:02x}"


def visible_controls(text: str) -> str:
    """`text` with every control character except tab and newline shown as a symbol."""
    return _CONTROL.sub(_visible, text.replace("\r\n", "\n"))
