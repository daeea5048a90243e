"""The sweep in text: its table rows, and a terminal chart (plotext) of aggregate output
tok/s (the median of a level's repeats, with their p10-p90) and per-user decode tok/s
against concurrency, the knee and noisy levels marked.

Shared by `phasechat bench --sweep` (the chart printed after the table) and the UI's
sweep screen, so it sits below both and draws plain text: no Textual, no Rich. Concurrency is on a
log2 axis (1, 2, 4, 8 evenly spaced, as the knee is judged per doubling); aggregate
throughput is on the left axis, the per-user rate on the right.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from phasechat.chat.trips.sweep import LevelRun, SweepResult
from phasechat.telemetry.sweep_stats import KNEE_GROWTH, MAX_GROWTH, Level, LevelStep, RepeatSpread

AGGREGATE = "aggregate output tok/s (left)"
PER_USER = "per-user decode tok/s (right)"
SPREAD = "p10-p90 of the repeats"


def sweep_chart(
    levels: Sequence[Level],
    knee: int | None,
    *,
    width: int = 72,
    height: int = 18,
    color: bool = False,
    title: str = "",
    spreads: Mapping[int, RepeatSpread] | None = None,
    noisy: Collection[int] = (),
) -> str:
    """The chart as text, `width` x `height` characters; ANSI colours only if `color`.

    Aggregate throughput is each level's median in `spreads` (by concurrency) with a bar
    from its p10 to its p90, or the level's own figure where it has none; the levels in
    `noisy` are marked on their ticks. Nothing to draw (no level) gives ''. plotext keeps
    one global figure, so this is not for two threads at once (the CLI and the UI call it
    from one thread)."""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    if not ordered:
        return ""
    spreads = spreads or {}
    xs = [math.log2(lv.concurrency) for lv in ordered]
    labels = [str(lv.concurrency) for lv in ordered]
    known_spreads = [spreads.get(lv.concurrency) for lv in ordered]
    aggregate = [
        lv.output_throughput if sp is None else sp.median
        for lv, sp in zip(ordered, known_spreads, strict=True)
    ]
    bars = [(x, sp) for x, sp in zip(xs, known_spreads, strict=True) if sp and sp.width > 0]
    import plotext as plt  # here, not at start-up: the app's first frame does not need it

    plt.clear_figure()
    plt.plot_size(width, height)
    if not color:
        plt.theme("clear")
    plt.plot(xs, aggregate, marker="hd", label=AGGREGATE)
    for i, (x, sp) in enumerate(bars):  # one vertical bar a level, labelled once
        plt.plot([x, x], [sp.p10, sp.p90], marker="│", label=SPREAD if i == 0 else None)
    users = [(x, lv.per_user_decode_tok_s) for x, lv in zip(xs, ordered, strict=True)]
    known = [(x, v) for x, v in users if v is not None]
    if known:
        plt.plot(
            [x for x, _ in known], [v for _, v in known], marker="dot", yside="right",
            label=PER_USER,
        )  # fmt: skip
    # marked on their own ticks, so no label covers a line or the legend
    labels = [
        lab
        + (" noisy" if lv.concurrency in noisy else "")
        + (" knee" if lv.concurrency == knee else "")
        for lab, lv in zip(labels, ordered, strict=True)
    ]
    plt.xticks(xs, labels)
    if len(xs) == 1:  # one level: give the axis some width around it
        plt.xlim(xs[0] - 1, xs[0] + 1)
    plt.ylim(0, max([*aggregate, *(sp.p90 for _, sp in bars)]) * 1.15 or 1)
    if known:
        plt.ylim(0, max(v for _, v in known) * 1.15 or 1, yside="right")
    if knee is not None:
        plt.vline(math.log2(knee))
    plt.xlabel("concurrent requests")
    if title:  # plotext drops a title wider than the chart
        plt.title(title if len(title) <= width - 4 else title[: width - 5] + "…")
    text = str(plt.build())
    plt.clear_figure()
    return text if color else strip_ansi(text)


def result_chart(result: SweepResult, **kw: Any) -> str:
    """`sweep_chart` of a sweep: its medians with their spreads, its noisy levels marked
    (a spread wider than the step up to it, or an impossible step), its knee."""
    spreads = {run.concurrency: run.spread for run in result.runs}
    noisy = {s.high for s in result.steps if s.high_noisy or s.impossible}
    return sweep_chart(result.levels, result.knee, spreads=spreads, noisy=noisy, **kw)


def strip_ansi(text: str) -> str:
    """plotext's output without its colour codes, and without trailing spaces."""
    import plotext as plt

    return "\n".join(line.rstrip() for line in plt.uncolorize(text).splitlines())


SWEEP_HEADER = (
    "  conc runs  done fail  agg tok/s     p10-p90  per-user tok/s  ttft p50/p99 ms  tpot ms"
    "  req/s  goodput"
)


def sweep_row(run: LevelRun, step: LevelStep | None = None) -> str:
    """One level as a table row (SWEEP_HEADER's columns): agg tok/s is the median of its
    repeats and p10-p90 their spread; the other columns pool every request of every
    repeat. Under it, a line per flag of `step` (the step up to it from the level before):
    a spread wider than the step, a growth no server can give."""
    lv, spread = run.level, run.spread
    good = "-" if lv.request_goodput is None else f"{lv.request_goodput:.2f}"
    ttft = f"{_f(lv.ttft['median'], 0)}/{_f(lv.ttft['p99'], 0)}"
    row = (
        f"{lv.concurrency:>6} {len(spread.values):>4} {lv.completed:>5} {lv.failed:>4}"
        f" {spread.median:>10.1f} {spread.p10:>7.1f}-{spread.p90:<7.1f}"
        f"{_f(lv.per_user_decode_tok_s, 1):>11} {ttft:>16} {_f(lv.tpot['mean'], 1):>8}"
        f" {lv.request_throughput:>6.2f} {good:>8}"
    )
    return "\n".join([row, *(f"{'':>6} ^ {flag}" for flag in flags(step))])


def flags(step: LevelStep | None) -> list[str]:
    """What is wrong with the step up to a level, in words (nothing when it is clean)."""
    if step is None:
        return []
    out = []
    if step.high_noisy:
        out.append(
            f"noisy: spread {step.high_spread.width:.1f} wider than step"
            f" {abs(step.change):.1f} tok/s (from {step.low})"
        )
    if step.impossible:
        assert step.growth is not None
        out.append(
            f"impossible: {step.growth:+.0%} per doubling from {step.low} (at most"
            f" {MAX_GROWTH:+.0%}): measurement noise"
        )
    return out


def sweep_table(result: SweepResult) -> list[str]:
    """The whole table: SWEEP_HEADER, a row a level (flags under it), the warm-up."""
    into = {step.high: step for step in result.steps}
    rows = [sweep_row(run, into.get(run.concurrency)) for run in result.runs]
    return [SWEEP_HEADER, *rows, warm_up_line(result)]


def warm_up_line(result: SweepResult) -> str:
    """The request(s) sent before the first level: a server's own counters count them."""
    n = result.warm_up_requests
    if not n:
        return "warm-up: none (the first level's first requests found the server cold)"
    return f"warm-up: {n} request{'s' if n > 1 else ''} before the first level (not in the figures)"


def sweep_notes(result: SweepResult) -> list[str]:
    """The lines under the chart: growth per doubling (medians of the repeats), the knee,
    how often each level ran, what goodput counted."""
    lines = []
    for step in result.steps:
        if step.growth is None:
            continue
        line = f"{step.low} -> {step.high}: aggregate {step.growth:+.0%} per doubling"
        if step.impossible:
            line += " (impossible: measurement noise, not the server)"
        elif step.inside_noise:
            line += (
                f" (inside the noise: spread {step.noise:.1f} wider than step"
                f" {abs(step.change):.1f} tok/s)"
            )
        lines.append(line)
    reading, limit = result.knee_reading, f"{KNEE_GROWTH:.0%}"
    knee, unclear = reading.concurrency, reading.unclear
    if unclear is not None:
        assert unclear.growth is not None
        lines.append(
            f"knee: not claimed: {unclear.low} -> {unclear.high} adds {unclear.growth:+.0%}"
            f" per doubling (< {limit}) inside the noise (spread {unclear.noise:.1f}"
            f" > step {abs(unclear.change):.1f} tok/s)"
        )
    elif knee is None:
        lines.append(
            f"knee: not reached (every doubling still adds >= {limit} aggregate throughput)"
        )
    else:
        lines.append(
            f"knee: concurrency {knee} (the next doubling adds < {limit} aggregate throughput)"
        )
        if any((s.growth or 0.0) >= KNEE_GROWTH for s in result.steps if s.low > knee):
            lines.append("  throughput grew again past it: a noisy run? (see the load average)")
    if result.repeats > 1 or result.max_repeats > 1:
        lines.append(
            f"each level ran {result.repeats} times (a noisy one up to {result.max_repeats}):"
            " agg tok/s is their median, p10-p90 their spread"
        )
    if result.slo.given:
        lines.append(
            f"goodput: requests per second within TTFT <= {_f(result.slo.ttft_ms, 0)} ms "
            f"and TPOT <= {_f(result.slo.tpot_ms, 0)} ms (- = not required)"
        )
    start, end = result.load
    if start is not None and end is not None:
        lines.append(
            f"load average (1 min): {start:.2f} at the start, {end:.2f} at the end, "
            f"on {os.cpu_count()} cores"
        )
    return lines


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
