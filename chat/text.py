"""Model output, and every other string from outside, is data: never markup or
terminal control.

Terminal escape sequences (ANSI colours, OSC title changes, hyperlinks, OSC 52 clipboard
writes), other control characters and the bidi overrides that reorder what a reader sees
are made visible instead of interpreted, before text reaches a terminal, a widget or an
export. Server strings (model ids, error bodies, state details), chat titles and user
theme errors all go through `visible_controls` before they are drawn.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from phasechat.backends.untrusted import text_in

# C0 controls except TAB and LF, DEL, the C1 block (which some terminals honour), and the
# bidi embeddings, overrides and isolates (U+202A-202E, U+2066-2069: "Trojan Source").
# Lone surrogates too: JSON can carry one (`"\\ud800"`), and no terminal, file or
# database that speaks UTF-8 accepts it.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

#: The URL schemes a click on a link in an answer may open.
LINK_SCHEMES = ("http", "https")


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode "control picture": ESC -> ␛
    if code == 0x7F:
        return "\u2421"  # ␡
    if code <= 0x9F:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"  # a lone surrogate: the replacement character, as a decoder does
    return f"<U+{code:04X}>"  # a bidi control, shown by name


def visible_controls(text: str) -> str:
    """`text` with every control character except tab and newline shown as a symbol."""
    return _CONTROL.sub(_visible, text.replace("\r\n", "\n"))


def one_line(text: str) -> str:
    """`text` safe to draw on one line: controls visible, newlines and tabs as spaces."""
    return visible_controls(" ".join(text.split()))


def has_controls(text: str) -> bool:
    """Whether `text` holds a character `visible_controls` would replace (or a tab/LF)."""
    return bool(_CONTROL.search(text)) or "\t" in text or "\n" in text


def safe_link(href: str) -> str | None:
    """`href` if a click may open it (http or https, a host, no controls), else None."""
    href = href.strip()
    if has_controls(href) or any(c.isspace() for c in href):
        return None
    try:
        parts = urlsplit(href)
    except ValueError:
        return None
    return href if parts.scheme.lower() in LINK_SCHEMES and parts.netloc else None


def is_text(text: str) -> bool:
    """False for a str that holds lone surrogates: bytes that were not valid UTF-8
    (Python's `surrogateescape` for argv) and cannot be stored or encoded."""
    return text_in(text) is not None
