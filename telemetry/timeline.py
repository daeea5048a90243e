"""An answer's own timeline: each token event with the gap before it, ranked among this
answer's gaps (quantile shades), the stalls (a gap over STALL_X times the median), the
handover from thinking to answer, and the chunks that carried several tokens (on a
remote stream a burst of those is the network or a proxy, not the model).

Built from a `Trace`: its per-event times, sizes, lengths and kinds, and the answer's and
thinking's text, cut back into the events that brought them.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from phasechat.backends.tokens import estimate_pieces
from phasechat.telemetry.recorder import Trace

#: A gap over this many times the answer's median gap is a stall.
STALL_X = 4
#: The shades: gaps are ranked into this many quantiles of the answer's own gaps.
SHADES = 5


class Tick(NamedTuple):
    """One token event: its text, the gap before it, and what stands out about it."""

    text: str
    gap_ms: float  # since the event before (the first: since the request was sent)
    shade: int  # 0 (among the shortest gaps) .. SHADES - 1 (among the longest)
    stall: bool
    thinking: bool
    tokens: int  # the tokens it carried (its text's, estimated, where the stream did not say)


@dataclass(frozen=True, slots=True)
class Timeline:
    """An answer's token events, as columns: a 1 MB answer has 100k events, and 100k
    objects made in a UI that holds the answer cost more in garbage collection than
    the arithmetic (0.8 s against 0.4 s, bench/long_chat.py); a `Tick` is made only for
    an event that is drawn."""

    texts: list[str]
    gaps_ms: list[float]  # since the event before (the first: since the request was sent)
    shades: list[int]  # 0 (among the shortest gaps) .. SHADES - 1 (among the longest)
    stalled: list[bool]
    thinking: list[bool]
    tokens: list[int]  # the tokens each carried (estimated where the stream did not say)
    #: the upper bound of each shade's gaps, in ms (the legend)
    bounds: tuple[float, ...]
    median_ms: float | None
    #: the events are every token event (False: a very long answer was sampled)
    whole: bool
    tokens_estimated: bool

    def __len__(self) -> int:
        return len(self.texts)

    def tick(self, i: int) -> Tick:
        """The `i`th event."""
        return Tick(
            self.texts[i], self.gaps_ms[i], self.shades[i], self.stalled[i],
            self.thinking[i], self.tokens[i],
        )  # fmt: skip

    @property
    def ticks(self) -> list[Tick]:
        """Every event as a `Tick` (for a short answer, or a test)."""
        return [self.tick(i) for i in range(len(self))]

    @property
    def stalls(self) -> int:
        return sum(self.stalled)


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
    """The timeline of a finished (or running) answer's trace. Array arithmetic, one
    tokenization per text: a 1 MB answer of 100k events is ready in about half a second."""
    n = len(trace.times)
    whole = trace.stride == 1
    times = np.asarray(trace.times, np.float64)
    gaps = np.empty(n)
    if n:
        gaps[0] = times[0] / 1e6
        gaps[1:] = np.diff(times) / 1e6 * trace.stride
    inner = gaps[1:].tolist()  # the first gap is the TTFT: not among the inter-token gaps
    bounds = quantile_bounds(inner)
    median = statistics.median(inner) if inner else None
    shades = np.full(n, SHADES - 1)
    if bounds:
        shades[1:] = np.minimum(np.searchsorted(bounds, gaps[1:], "left"), SHADES - 1)
    stalls = np.zeros(n, bool)
    if median:
        stalls[1:] = gaps[1:] > STALL_X * median

    def padded(values: Sequence[int]) -> list[int]:
        return list(values[:n]) + [0] * (n - len(values))

    kinds = [1 if k else 0 for k in padded(trace.kinds)]
    lengths, sizes = padded(trace.lengths), padded(trace.sizes)
    # each event's piece of its text, and a remote chunk's tokens estimated from the
    # whole text (one tokenization, not one per chunk)
    texts: list[str] = [""] * n
    estimates = np.zeros(n, np.int64)
    for kind, source in enumerate((trace.text, trace.reasoning)):
        at = [i for i, k in enumerate(kinds) if k == kind]
        mine = [lengths[i] for i in at]
        if not whole or not at:
            continue
        cuts = [0, *itertools.accumulate(mine)]
        for i, a, b in zip(at, cuts, cuts[1:], strict=False):  # cuts: one more
            texts[i] = source[a:b]
        if any(not sizes[i] for i in at):
            estimates[at] = estimate_pieces(source, mine)
    # a remote chunk (no count of its own): its text's tokens, estimated
    tokens = np.where(np.asarray(sizes, np.int64) > 0, sizes, np.maximum(estimates, 1))
    return Timeline(
        texts,
        gaps.tolist(),
        shades.tolist(),
        stalls.tolist(),
        [bool(k) for k in kinds],
        tokens.tolist(),
        bounds,
        median,
        whole,
        not trace.tokens_known,
    )
