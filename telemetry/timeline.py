"""An answer's own timeline: each token event with the gap before it, ranked among this
answer's gaps (quantile shades), the stalls (a gap over STALL_X times the median), the
handover from thinking to answer, and the chunks that carried several tokens (on a
remote stream a burst of those is the network or a proxy, not the model).

Built from a `Trace`: its per-event times, sizes, lengths and kinds, and the answer's and
thinking's text, cut back into the events that brought them.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from phasechat.backends.tokens import estimate_text
from phasechat.telemetry.recorder import Trace

#: A gap over this many times the answer's median gap is a stall.
STALL_X = 4
#: The shades: gaps are ranked into this many quantiles of the answer's own gaps.
SHADES = 5


@dataclass(frozen=True, slots=True)
class Tick:
    """One token event: its text, the gap before it, and what stands out about it."""

    text: str
    gap_ms: float  # since the event before (the first: since the request was sent)
    shade: int  # 0 (among the shortest gaps) .. SHADES - 1 (among the longest)
    stall: bool
    thinking: bool
    tokens: int  # the tokens it carried (its text's, estimated, where the stream did not say)


@dataclass(frozen=True, slots=True)
class Timeline:
    ticks: tuple[Tick, ...]
    #: the upper bound of each shade's gaps, in ms (the legend)
    bounds: tuple[float, ...]
    median_ms: float | None
    #: the events are every token event (False: a very long answer was sampled)
    whole: bool
    tokens_estimated: bool

    @property
    def stalls(self) -> int:
        return sum(t.stall for t in self.ticks)


def quantile_bounds(gaps: list[float], shades: int = SHADES) -> tuple[float, ...]:
    """The gap at each shade's upper end: the 1/shades, 2/shades ... quantiles."""
    ordered = sorted(gaps)
    if not ordered:
        return ()
    out = []
    for k in range(1, shades + 1):
        i = min(len(ordered) - 1, max(0, round(k * len(ordered) / shades) - 1))
        out.append(ordered[i])
    return tuple(out)


def timeline_of(trace: Trace) -> Timeline:
    """The timeline of a finished (or running) answer's trace."""
    times = list(trace.times)
    whole = trace.stride == 1
    answer, thought = trace.text, trace.reasoning
    cursor = [0, 0]  # how far into the answer and the thinking the events have come
    gaps = [
        (times[i] - times[i - 1]) / 1e6 * trace.stride if i else times[0] / 1e6
        for i in range(len(times))
    ]
    inner = gaps[1:]  # the first gap is the TTFT: not among the inter-token gaps
    bounds = quantile_bounds(inner)
    median = statistics.median(inner) if inner else None
    ticks = []
    for i, gap in enumerate(gaps):
        kind = trace.kinds[i] if i < len(trace.kinds) else 0
        length = trace.lengths[i] if i < len(trace.lengths) else 0
        source = thought if kind else answer
        text = source[cursor[kind] : cursor[kind] + length] if whole else ""
        cursor[kind] += length
        shade = min(bisect.bisect_left(bounds, gap), SHADES - 1) if i and bounds else SHADES - 1
        stall = bool(i and median and gap > STALL_X * median)
        size = trace.sizes[i] if i < len(trace.sizes) else 0
        if not size:  # a remote chunk: its text's tokens, estimated
            size = max(1, estimate_text(text)) if text else 1
        ticks.append(Tick(text, gap, shade, stall, bool(kind), size))
    return Timeline(tuple(ticks), bounds, median, whole, not trace.tokens_known)
