"""Per-request history exports: JSONL (every metric and per-token times) and CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.recorder import Trace

#: CSV columns: every scalar metric, in the order Metrics declares them.
CSV_FIELDS = ["request", "prompt"] + [f.name for f in fields(Metrics) if f.name != "warnings"]


def record(index: int, prompt: str, metrics: Metrics, trace: Trace) -> dict[str, Any]:
    """One request as a JSON-ready dict: its metrics plus the arrival time of each token."""
    out: dict[str, Any] = {"request": index, "prompt": prompt, **metrics.as_dict()}
    stride = trace.stride
    out["token_times_ms"] = [round(t / 1e6, 3) for t in trace.times]
    if stride > 1:  # a very long answer: every stride-th token's time was kept
        out["token_times_stride"] = stride
    return out


def to_jsonl(records: Iterable[dict[str, Any]]) -> str:
    """One JSON object per line."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def to_csv(records: Iterable[dict[str, Any]]) -> str:
    """A spreadsheet of the scalar metrics, one row per request."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for r in records:
        writer.writerow({k: _cell(r.get(k)) for k in CSV_FIELDS})
    return buf.getvalue()


def _cell(value: object) -> object:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, str):
        # A prompt starting with = + - @ would be a formula in a spreadsheet.
        return "'" + value if value[:1] in ("=", "+", "-", "@") else value
    return "" if value is None else value
