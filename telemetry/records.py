"""Per-request history exports: JSONL (every metric and per-token times) and CSV."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.recorder import Trace

#: CSV columns: every scalar metric, in the order Metrics declares them.
CSV_FIELDS = ["request", "prompt"] + [
    f.name for f in fields(Metrics) if f.name not in ("warnings", "ignored")
]


def answer_record(index: int, prompt: str, metrics: Metrics, trace: Trace) -> dict[str, Any]:
    """One request as a JSON-ready dict: its metrics plus the arrival time of each token."""
    out: dict[str, Any] = {"request": index, "prompt": prompt, **metrics.as_dict()}
    stride = trace.stride
    out["token_times_ms"] = [round(t / 1e6, 3) for t in trace.times]
    if stride > 1:  # a very long answer: every stride-th token's time was kept
        out["token_times_stride"] = stride
    return out


#: DEL and the C1 block: JSON allows them raw, and some terminals act on them.
_RAW_CONTROLS = re.compile("[\x7f-\x9f]")
#: What a spreadsheet treats as a formula or strips to find one (OWASP's list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def to_jsonl(records: Iterable[dict[str, Any]]) -> str:
    """One JSON object per line; safe to print (C0 is escaped by JSON, DEL and C1 here)."""
    return "".join(
        _RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(r, ensure_ascii=False))
        + "\n"
        for r in records
    )


def to_csv(records: Iterable[dict[str, Any]]) -> str:
    """A spreadsheet of the scalar metrics, one row per request."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for r in records:
        writer.writerow({k: _cell(r.get(k)) for k in CSV_FIELDS})
    return buf.getvalue()


_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    """Controls other than TAB, LF and CR as their escapes (CSV quotes those three)."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _cell(value: object) -> object:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, str):
        # A prompt starting with = + - @ (or TAB, CR before one) would be a formula in a
        # spreadsheet; ESC, other controls and C1 are shown, never written raw.
        value = _visible(value)
        return "'" + value if value[:1] in _FORMULA_START else value
    return "" if value is None else value
