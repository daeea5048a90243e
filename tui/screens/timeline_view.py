"""An answer's own timeline (telemetry/timeline.py), drawn: the request's phases before
its first token, then the answer's text with each token shaded by the gap before it, a
legend in ms, stalls marked with their gap, the handover from thinking to answer, and
chunks that carried several tokens underlined. The text came from a model: drawn as
text, its control characters made visible."""

from __future__ import annotations

import itertools
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content

from phasechat.chat.text import visible_controls
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.timeline import STALL_X, Timeline
from phasechat.tui.screens.report_screen import ReportScreen
from phasechat.tui.widgets.clip import items_left_out, notice

#: the shades' backgrounds, from the shortest gaps (dark green) to the longest (red)
SHADE_COLOURS = ("#1e3b2a", "#2d5a2d", "#6b6520", "#8a4a1a", "#a3261c")


def phases_line(m: Metrics) -> Content:
    """The request's phases before its first token (a remote request's own: connect,
    headers), then the first and second token."""

    def at(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f} ms"

    parts: list[str | tuple[str, str]] = [("request  ", "bold")]
    if m.connect_ms is not None:
        connect = "kept-alive connection" if m.connect_ms == 0 else f"connect {at(m.connect_ms)}"
        parts += [f"{connect} · headers at {at(m.headers_ms)} · "]
    parts += [
        ("first token ", "$phase-prefill"),
        f"at {at(m.ttft_ms)} · second at {at(m.time_to_second_token_ms)}",
    ]
    if m.server_prompt_ms is not None and m.ttft_ms is not None:
        rest = m.ttft_ms - m.server_prompt_ms
        parts.append(
            (
                f"   (the server's prefill {at(m.server_prompt_ms)}; "
                f"transport and queue {at(rest)})",
                "dim",
            )
        )
    return Content.assemble(*parts)


def legend(t: Timeline) -> Content:
    parts: list[str | tuple[str, str]] = [("gap before each token  ", "bold")]
    low = 0.0
    for shade, bound in enumerate(t.bounds):
        parts += [(" ", f"on {SHADE_COLOURS[shade]}"), f" {low:,.1f}-{bound:,.1f} ms  "]
        low = bound
    if t.median_ms is not None:
        parts.append(
            (f"(median {t.median_ms:,.1f} ms; ‖ a stall: over {STALL_X}x the median)", "dim")
        )
    return Content.assemble(*parts)


def summary(t: Timeline, remote: bool) -> Content:
    approx = "~" if t.tokens_estimated else ""
    events = len(t)
    tokens = sum(t.tokens)
    bursts = sum(1 for n in t.tokens if n > 1)
    line = f"{events:,} token events, {approx}{tokens:,} tokens; {t.stalls} stall(s)"
    if bursts:
        why = " (a burst on a remote stream is the network or a proxy, not the model)"
        line += f"; {bursts} chunk(s) of several tokens, underlined" + (why if remote else "")
    if not t.whole:
        line += "; a very long answer: its times were sampled, the text is not shaded"
    return Content(line)


def shaded_text(t: Timeline) -> Content:
    """The answer's text, each token event shaded by the gap before it; a very long
    answer's middle events are left out (clip.py), with a line that says so."""
    parts: list[str | tuple[str, str] | Content] = []
    start, end = items_left_out([len(text) for text in t.texts]) or (0, 0)
    for i in itertools.chain(range(start), range(end, len(t))):
        tick = t.tick(i)
        if i and i == end:  # the first event after the middle left out
            chars = sum(len(text) for text in t.texts[start:end])
            parts.append(notice(chars, f"{end - start:,} token events"))
        thinking_before = i > 0 and t.thinking[i - 1]
        if tick.thinking and not thinking_before:
            parts.append(("── thinking ──\n", "bold $phase-thinking"))
        if not tick.thinking and thinking_before:
            parts.append(("\n── answer ──\n", "bold $phase-decode"))
        if tick.stall:
            parts.append((f"‖{tick.gap_ms:,.0f}ms ", "bold $error"))
        style = f"on {SHADE_COLOURS[tick.shade]}"
        if tick.tokens > 1:
            style += " underline"
        parts.append((visible_controls(tick.text), style))
    if end == len(t) > start:  # nothing after the middle left out (items_left_out keeps some)
        chars = sum(len(text) for text in t.texts[start:end])
        parts.append(notice(chars, f"{end - start:,} token events"))
    return Content.assemble(*parts)


class TimelineView(ReportScreen):
    """One answer's timeline; Esc (or `t`) closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("t", "dismiss", "Close", show=False)]

    def __init__(self, timeline: Timeline, metrics: Metrics, title: str, remote: bool) -> None:
        super().__init__()
        self.timeline, self.metrics, self.title_text, self.remote = timeline, metrics, title, remote

    def head(self) -> Content:
        t = self.timeline
        lines = [
            Content.styled(self.title_text, "bold"),
            phases_line(self.metrics),
            legend(t),
            summary(t, self.remote),
        ]
        return Content("\n").join(lines)

    def body(self) -> Content:
        return shaded_text(self.timeline)
