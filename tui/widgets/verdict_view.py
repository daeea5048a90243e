"""The verdict under a finished answer: which phase ate the wall time and the knob that
moves it (telemetry/verdict.py), in its own widget mounted under the message's footer."""

from __future__ import annotations

import asyncio

from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from phasechat.chat.roofline import Ceilings, ceilings
from phasechat.chat.text import one_line
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

    The roofline needs this machine's memory bandwidth (read from the cache, or probed
    once: about 0.3 s) and, for an answer with layers on a GPU, the GPU's (measured
    once a run), found in a thread, and only for a backend that knows its weights."""
    m = exchange.metrics
    if m is None or exchange.answer.status == "error":
        return None
    notes, found = notes_of(exchange), Ceilings()
    if m.implied_bandwidth_gb_s is not None or m.gpu_bytes_per_token is not None:
        found = await asyncio.to_thread(ceilings, m)
    if found.notice is not None:  # a damaged bandwidth.json, ignored
        notes.append(found.notice)
    judged = verdict(m, found.cpu_gb_s, found.cpu_label, found.gpu_gb_s, found.gpu_label)
    if judged is None:
        return None
    text = "\n".join([judged.line(), *(f"note: {one_line(n)}" for n in notes)])
    line = VerdictLine(Content(text))  # Content: plain text, never markup
    await view.mount(line)
    return line


def notes_of(exchange: Exchange) -> list[str]:
    """What the backend told about the answer that is not a doubted figure (those are
    among its warnings): a notice of a measurement ignored or stale, the server ignoring
    max_tokens, TLS verification off, a refused prompt trimmed and sent again."""
    trace = exchange.trace
    return [n for n in dict.fromkeys(trace.notices) if n not in trace.doubts]
