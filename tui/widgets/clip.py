"""Long text in a view, clipped to what can be drawn at once, and saying so.

A `Static` wraps and measures its whole text when it is shown: a 1 MB answer of 100k
lines froze the UI 11-37 s in the branch comparison, the prompt view and the timeline
(issue 38). Those views draw at most VIEW_CHARS of one text, its start and its end, with
a line in between that says how much of the middle was left out (the chat, the export
and the figures keep all of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from textual.content import Content

from phasechat.chat.text import visible_controls

#: The most characters of one text a view draws: a `Static` wraps its text 3-4 times
#: before its first frame (its width, its height, the paint), ~0.1 s per 16 KB of short
#: lines on a busy 2-core machine.
VIEW_CHARS = 16_000


def left_out(length: int, limit: int = VIEW_CHARS) -> tuple[int, int] | None:
    """The middle [start, end) of a `length`-character text left out of a view that
    draws `limit` of it (a quarter from the start, the rest from the end); None when
    it all fits."""
    if length <= limit:
        return None
    head = limit // 4
    return head, length - (limit - head)


def items_left_out(sizes: Sequence[int], limit: int = VIEW_CHARS) -> tuple[int, int] | None:
    """The same for a text drawn in pieces of `sizes` characters (a timeline's token
    events): the pieces [start, end) left out, whole pieces only; None when all fit."""
    total = sum(sizes)
    if total <= limit:
        return None
    head = limit // 4
    start = sum(1 for before in accumulate(sizes) if before <= head)
    tail = sum(1 for after in accumulate(reversed(sizes)) if after <= limit - head)
    return start, max(start, len(sizes) - tail)


def notice(chars: int, more: str = "") -> Content:
    """The line in place of what was left out: how many characters (and `more`)."""
    extra = f" ({more})" if more else ""
    return Content.styled(
        f"\n⟦… {chars:,} characters{extra} not drawn here: too long to draw at once …⟧\n",
        "bold $warning",
    )


def clipped(content: Content, limit: int = VIEW_CHARS) -> Content:
    """`content`, its middle left out (with a `notice`) when longer than `limit`."""
    cut = left_out(len(content), limit)
    if cut is None:
        return content
    start, end = cut
    return Content.assemble(content[:start], notice(end - start), content[end:])


def clipped_text(text: str, limit: int = VIEW_CHARS) -> Content:
    """Text from outside (an answer) as inert Content, its control characters made
    visible, its middle left out (with a `notice`) when longer than `limit`."""
    cut = left_out(len(text), limit)
    if cut is None:
        return Content(visible_controls(text))
    start, end = cut
    head, tail = visible_controls(text[:start]), visible_controls(text[end:])
    return Content.assemble(head, notice(end - start), tail)
