"""The sweep as a terminal chart (plotext): aggregate output tok/s and per-user decode
tok/s against concurrency, the knee marked.

Shared by `phasechat bench --sweep` (printed after the table) and the UI's sweep screen,
so it sits below both and draws plain text: no Textual, no Rich. Concurrency is on a
log2 axis (1, 2, 4, 8 evenly spaced, as the knee is judged per doubling); aggregate
throughput is on the left axis, the per-user rate on the right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotext as plt

from phasechat.telemetry.sweep_stats import Level

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
    return "\n".join(line.rstrip() for line in plt.uncolorize(text).splitlines())
