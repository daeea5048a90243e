"""Where a remote answer's waterfall is shown: `ask --json` and `ask --stats` (run as a
user runs them, against the scripted server on 127.0.0.1) and the panel's engine line."""

from __future__ import annotations

import json
import subprocess

import pytest

from phasechat.backends.remote.servers.dynamo import ROUTING, WORKER
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.waterfall import CONNECT, REST, SENT
from phasechat.tui.widgets.telemetry_view import context_gauge, engine_line
from tests.fault_server import fault_server_thread
from tests.test_cli import phasechat


def ask(flag: str) -> subprocess.CompletedProcess[str]:
    """`phasechat ask FLAG` against the scripted server's plain five-token answer."""
    with fault_server_thread() as srv:
        url = srv.base_url
        r = phasechat(
            "ask", flag, "--backend", "openai", "--base-url", url, "--model", "ok-5", "hi"
        )
    assert r.returncode == 0, r.stderr
    return r


def test_ask_json_carries_the_waterfall_of_a_server_that_says_nothing_of_itself() -> None:
    out = json.loads(ask("--json").stdout)
    wf = out["waterfall"]
    assert [s["name"] for s in wf["steps"]] == [CONNECT, SENT, REST]
    assert {s["source"] for s in wf["steps"]} == {"measured here"}
    assert out["sent_ms"] is not None and out["connect_ms"] is not None
    rest = wf["steps"][2]["ms"]
    assert rest == pytest.approx(out["ttft_ms"] - out["sent_ms"])
    assert wf["contradiction"] is None


def test_ask_stats_prints_the_waterfall_line() -> None:
    r = ask("--stats")
    (line,) = [ln for ln in r.stderr.splitlines() if " = connect " in ln]
    assert line.startswith("TTFT ") and "the rest" in line


def test_the_panels_engine_line_shows_the_waterfall_and_the_kv_hit() -> None:
    m = metrics_from_dict(
        {
            "backend": "openai",
            "ttft_ms": 250.0,
            "e2e_ms": 900.0,
            "headers_ms": 5.0,
            "connect_ms": 2.0,
            "sent_ms": 3.0,
            "server_source": "Dynamo nvext",
            "server_queue_ms": 40.0,
            "server_prompt_ms": 120.0,
            "server_kv_hit_share": 0.875,
        }
    )
    text = engine_line(m).plain
    assert "wait TTFT 250 ms = connect 2 · request sent 1 · queued 40 · prefill 120" in text
    assert "the rest 87 ms" in text and "KV hit 88%" in text
    local = metrics_from_dict({"backend": "local", "ttft_ms": 250.0, "e2e_ms": 900.0})
    assert "wait" not in engine_line(local).plain


WHY = "Dynamo lists context_window 0: its workers declared no --max-model-len"


def test_the_panel_names_a_server_s_own_parts_and_why_its_window_is_unknown() -> None:
    m = metrics_from_dict(
        {
            "backend": "openai", "ttft_ms": 30.0, "e2e_ms": 70.0, "headers_ms": 5.0,
            "connect_ms": 0.0, "sent_ms": 1.0, "server_source": "Dynamo nvext",
            "server_queue_ms": 2.0, "server_prompt_ms": 19.0, "server_ttft_ms": 21.0,
            "server_kv_hit_share": 0.0,
            "server_queue_name": ROUTING.name, "server_queue_means": ROUTING.means,
            "server_prefill_name": WORKER.name, "server_prefill_means": WORKER.means,
            "context_source": WHY,
        }
    )  # fmt: skip
    text = engine_line(m).plain
    assert (
        "Dynamo nvext says frontend: tokenize + route 2 ms · worker: queue + prefill 19 ms"
        " · KV hit 0%" in text
    )
    assert (
        "wait TTFT 30 ms = connect 0 · request sent 1 · frontend: tokenize + route 2 · "
        "worker: queue + prefill 19 · the rest 8 ms" in text
    )
    assert context_gauge(m).plain == f"context window unknown ({WHY}; --context N)"
    said_nothing = metrics_from_dict({"backend": "openai", "ttft_ms": 30.0, "e2e_ms": 70.0})
    assert context_gauge(said_nothing).plain == (
        "context window unknown (the server does not report it; --context N)"
    )
