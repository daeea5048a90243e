"""Per-request exports (telemetry/records.py): the token times in the unit their name
says, the stride of a long answer, and every CSV column in Metrics' order."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from phasechat.backends.events import Finished, PromptEvaluated, TextDelta
from phasechat.telemetry.metric_set import flat_names
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import MAX_TIMES, Trace
from phasechat.telemetry.records import CSV_FIELDS, answer_record, to_csv, to_jsonl

US = 1_000


def answer_trace() -> Trace:
    """Sent at 1 s; tokens 200.5006, 210.2506 and 230.0006 ms after the send."""
    t = Trace("local", "m")
    t.t_sent = 1_000_000 * US
    t.observe(PromptEvaluated(12, 2, 10), t.t_sent + 50_000 * US)
    for after_us in (200_500, 210_250, 230_000):
        t.observe(TextDelta("ab", 1), t.t_sent + after_us * US + 600)
    t.observe(Finished("stop"), t.t_sent + 240_000 * US)
    return t


def test_token_times_are_ms_after_the_send_rounded_to_the_microsecond() -> None:
    t = answer_trace()
    m = compute(t)
    record = answer_record(3, "a question", m, t)
    assert record["token_times_ms"] == [200.501, 210.251, 230.001]  # not us, not s
    assert "token_times_stride" not in record
    assert (record["request"], record["prompt"]) == (3, "a question")
    assert {k: v for k, v in record.items() if k in m.as_dict()} == m.as_dict()
    assert record["ttft_ms"] == 200.5006 and record["e2e_ms"] == 240.0
    # every field but `ignored` (written only when a figure read back was dropped), and
    # the request, the prompt and the token times
    assert len(record) == len(flat_names()) + 3 and "ignored" not in record
    back = json.loads(to_jsonl([record, record]).splitlines()[1])
    assert back == record


def test_a_long_answer_keeps_its_stride() -> None:
    t = Trace("local", "m")
    for i in range(MAX_TIMES + 1):
        t.observe(TextDelta("", 1), (1 + i) * 1_000_000)
    record = answer_record(1, "q", compute(t), t)
    assert record["token_times_stride"] == 2
    assert record["token_times_ms"][:3] == [1.0, 3.0, 5.0]  # every other token's time


def test_a_csv_row_has_every_scalar_metric_in_order_floats_to_three_places() -> None:
    t = answer_trace()
    record = answer_record(1, "q", compute(t), t)
    text = to_csv([record])
    header, row = list(csv.reader(io.StringIO(text)))
    assert header == CSV_FIELDS
    assert header[:5] == ["request", "prompt", "backend", "model", "finish"]
    assert "warnings" not in header and "token_times_ms" not in header
    cells = dict(zip(header, row, strict=True))
    assert (cells["request"], cells["prompt"], cells["backend"]) == ("1", "q", "local")
    assert (cells["ttft_ms"], cells["e2e_ms"]) == ("200.501", "240.000")  # 3 places
    assert (cells["prompt_tokens"], cells["cached_tokens"], cells["output_tokens"]) == (
        "12",
        "2",
        "3",
    )
    assert (cells["server_source"], cells["load_ms"]) == ("", "")  # None: empty
    assert cells["cache_reported"] == "True"


def test_a_prompt_a_spreadsheet_would_read_as_a_formula_is_quoted() -> None:
    rows = [
        {"request": i, "prompt": p} for i, p in enumerate(["@SUM(A1)", "-2+3", "+1", "=1", "a=1"])
    ]
    prompts = [r["prompt"] for r in csv.DictReader(io.StringIO(to_csv(rows)))]
    assert prompts == ["'@SUM(A1)", "'-2+3", "'+1", "'=1", "a=1"]


def test_jsonl_is_strict_json_and_safe_to_print() -> None:
    # a metric that is not finite (read back from a damaged row, or a 0/0) is null, not
    # the bare NaN/Infinity Python writes and other parsers refuse; bidi controls escaped
    record = {"request": 1, "prompt": "a\u202eb\x9bc", "ttft_ms": math.nan, "e2e_ms": -math.inf}
    line = to_jsonl([record])
    assert "NaN" not in line and "Infinity" not in line
    assert "\\u202e" in line and "\\u009b" in line and "\u202e" not in line
    back = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert back == {"request": 1, "prompt": "a\u202eb\x9bc", "ttft_ms": None, "e2e_ms": None}
