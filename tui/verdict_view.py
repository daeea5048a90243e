"""The verdict under a finished answer: which phase ate the wall time and the knob that
moves it (telemetry/verdict.py), in its own widget mounted under the message's footer."""

from __future__ import annotations

import asyncio

from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from phasechat.chat.roofline import machine_bandwidth
from phasechat.chat.turns import Exchange
from phasechat.telemetry.verdict import verdict


class VerdictLine(Static):
    """One line under an answer's footer."""

    DEFAULT_CSS = """
    VerdictLine { color: $text-muted; text-style: italic; }
    """


async def add_verdict(view: Widget, exchange: Exchange) -> VerdictLine | None:
    """Mount the verdict on `exchange`'s answer at the end of `view` (its MessageView);
    None when the answer has nothing to judge (it failed before its first token).

    The roofline needs this machine's memory bandwidth: read from the cache, or probed
    once (about 0.3 s) in a thread, and only for a backend that knows its weights."""
    m = exchange.metrics
    if m is None or exchange.answer.status == "error":
        return None
    bandwidth = None
    if m.implied_bandwidth_gb_s is not None:
        bandwidth = (await asyncio.to_thread(machine_bandwidth)).gb_s
    judged = verdict(m, bandwidth)
    if judged is None:
        return None
    line = VerdictLine(Content(judged.line()))  # Content: plain text, never markup
    await view.mount(line)
    return line
