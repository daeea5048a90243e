"""Per-request history exports: JSONL (every metric and per-token times) and CSV."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from phasechat.telemetry.metric_set import Metrics, flat_names
from phasechat.telemetry.recorder import Trace

#: CSV columns: every scalar metric, in the order a metric set is stored.
CSV_FIELDS = ["request", "prompt"] + [n for n in flat_names() if n != "warnings"]


def answer_record(index: int, prompt: str, metrics: Metrics, trace: Trace) -> dict[str, Any]:
    """One request as a JSON-ready dict: its metrics plus the arrival time of each token."""
    out: dict[str, Any] = {"request": index, "prompt": prompt, **metrics.as_dict()}
    stride = trace.stride
    out["token_times_ms"] = [round(t / 1e6, 3) for t in trace.times]
    if stride > 1:  # a very long answer: every stride-th token's time was kept
        out["token_times_stride"] = stride
    return out


#: What a spreadsheet treats as a formula or strips to find one (OWASP's list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


#: DEL, the C1 block (some terminals act on them) and the bidi controls (they reorder
#: the line a terminal shows: "Trojan Source"); JSON allows all of them raw.
_ESCAPED = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def dumps(obj: object, indent: int | None = None) -> str:
    """JSON that is safe to print to a terminal yet keeps non-ASCII text readable: every
    JSON phasechat prints or writes goes through here. Strictly JSON: a number that is
    not finite (NaN, infinity) is `null`, never the bare `NaN` other parsers refuse."""
    try:
        text = json.dumps(obj, ensure_ascii=False, indent=indent, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), ensure_ascii=False, indent=indent, allow_nan=False)
    # Outside strings JSON is ASCII, so these can only be string content: escape them.
    return _ESCAPED.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _finite(obj: object) -> object:
    """`obj` with every float that is not finite made None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def to_jsonl(records: Iterable[dict[str, Any]]) -> str:
    """One JSON object per line, as `dumps` writes them (strict, safe to print)."""
    return "".join(dumps(r) + "\n" for r in records)


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
