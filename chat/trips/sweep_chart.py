"""The sweep in text: its table rows, and a terminal chart (plotext) of aggregate output
tok/s and per-user decode tok/s against concurrency, the knee marked.

Shared by `phasechat bench --sweep` (the chart printed after the table) and the UI's
sweep screen, so it sits below both and draws plain text: no Textual, no Rich. Concurrency is on a
log2 axis (1, 2, 4, 8 evenly spaced, as the knee is judged per doubling); aggregate
throughput is on the left axis, the per-user rate on the right.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence

from phasechat.chat.trips.sweep import SweepResult
from phasechat.telemetry.sweep_stats import KNEE_GROWTH, Level, growth_per_doubling

AGGREGATE = "aggregate output tok/s (left)"
PER_USER = "per-user decode tok/s (right)"


def sweep_chart(
    levels: Sequence[Level],
    knee: int | None,
    *,
    width: int = 72,
    height: int = 18,
    color: bool = False,
    title: str = "",
) -> str:
    """The chart as text, `width` x `height` characters; ANSI colours only if `color`.

    Nothing to draw (no level) gives ''. plotext keeps one global figure, so this is not
    for two threads at once (the CLI and the UI call it from one thread)."""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    if not ordered:
        return ""
    xs = [math.log2(lv.concurrency) for lv in ordered]
    labels = [str(lv.concurrency) for lv in ordered]
    aggregate = [lv.output_throughput for lv in ordered]
    import plotext as plt  # here, not at start-up: the app's first frame does not need it

    plt.clear_figure()
    plt.plot_size(width, height)
    if not color:
        plt.theme("clear")
    plt.plot(xs, aggregate, marker="hd", label=AGGREGATE)
    users = [(x, lv.per_user_decode_tok_s) for x, lv in zip(xs, ordered, strict=True)]
    known = [(x, v) for x, v in users if v is not None]
    if known:
        plt.plot(
            [x for x, _ in known], [v for _, v in known], marker="dot", yside="right",
            label=PER_USER,
        )  # fmt: skip
    if knee is not None:  # marked on its own tick, so no label covers a line or the legend
        labels = [
            f"{lab} knee" if lv.concurrency == knee else lab
            for lab, lv in zip(labels, ordered, strict=True)
        ]
    plt.xticks(xs, labels)
    if len(xs) == 1:  # one level: give the axis some width around it
        plt.xlim(xs[0] - 1, xs[0] + 1)
    plt.ylim(0, max(aggregate) * 1.15 or 1)
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


def strip_ansi(text: str) -> str:
    """plotext's output without its colour codes, and without trailing spaces."""
    import plotext as plt

    return "\n".join(line.rstrip() for line in plt.uncolorize(text).splitlines())


SWEEP_HEADER = (
    "  conc  done fail   agg tok/s  per-user tok/s  ttft p50 ms  ttft p99 ms  tpot ms"
    "  req/s  goodput"
)


def sweep_row(lv: Level) -> str:
    """One level as a table row (SWEEP_HEADER's columns)."""
    good = "-" if lv.request_goodput is None else f"{lv.request_goodput:.2f}"
    return (
        f"{lv.concurrency:>6} {lv.completed:>5} {lv.failed:>4} {lv.output_throughput:>11.1f}"
        f" {_f(lv.per_user_decode_tok_s, 1):>15} {_f(lv.ttft['median'], 0):>12}"
        f" {_f(lv.ttft['p99'], 0):>12} {_f(lv.tpot['mean'], 1):>8}"
        f" {lv.request_throughput:>6.2f} {good:>8}"
    )


def sweep_notes(result: SweepResult) -> list[str]:
    """The lines under the chart: growth per doubling, the knee, what goodput counted."""
    lines = []
    for low, high in itertools.pairwise(result.levels):
        growth = growth_per_doubling(low, high)
        if growth is not None:
            lines.append(
                f"{low.concurrency} -> {high.concurrency}: aggregate {growth:+.0%} per doubling"
            )
    knee, limit = result.knee, f"{KNEE_GROWTH:.0%}"
    if knee is None:
        lines.append(
            f"knee: not reached (every doubling still adds >= {limit} aggregate throughput)"
        )
    else:
        lines.append(
            f"knee: concurrency {knee} (the next doubling adds < {limit} aggregate throughput)"
        )
        later = [lv for lv in result.levels if lv.concurrency > knee]
        if any(
            (growth_per_doubling(low, high) or 0.0) >= KNEE_GROWTH
            for low, high in itertools.pairwise(later)
        ):
            lines.append("  throughput grew again past it: a noisy run? (see the load average)")
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
