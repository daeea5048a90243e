"""`phasechat bench --sweep` against a real llama-server with 4 slots (`--parallel 4`) on
127.0.0.1: the sweep's counts, over every repeat of every level, are the server's own. No
timing is asserted (the figures go to bench/README.md-style measurements, not tests)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.sweep import sweep
from phasechat.cli.main import main

pytestmark = [pytest.mark.server]

# 4 slots of 1,024 tokens each (n_ctx is split between slots): a sweep request is
# ~55 prompt tokens and at most 24 answer tokens. --metrics: the server's own counters.
SERVER_ARGS = ("--parallel", "4", "-c", "4096", "--metrics")


def read_counters(base_url: str) -> dict[str, float]:
    """llama-server's Prometheus counters (`llamacpp:...`), by name."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split()
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def counters(base_url: str) -> dict[str, float]:
    """The counters once the server is idle: it sends an answer's last chunk before it
    releases the slot and adds the request to its counters, so a read right after the
    last answer can miss it. Idle = nothing processing and two reads alike."""
    last = read_counters(base_url)
    for _ in range(100):
        time.sleep(0.1)
        now = read_counters(base_url)
        if now == last and not now.get("requests_processing"):
            return now
        last = now
    return last


async def test_sweep_counts_are_the_servers(start_llama_server: Callable[..., str]) -> None:
    base = start_llama_server(*SERVER_ARGS)
    backend = RemoteBackend(RemoteConfig(base_url=base))
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    before = counters(base)
    try:
        # one request a stream per repeat, 2 repeats a level, 3 when noisy: at most 1.5
        # times the requests of one run of 2 a stream (on a busy 2-core machine most
        # levels are noisy; 3 repeats up to 5 took this test from 45 s to 100-400 s)
        result = await sweep(
            backend, (1, 2, 4), Settings(max_tokens=24, temperature=0), per_stream=1,
            repeats=2, max_repeats=3, warm_up=False,
        )  # fmt: skip
    finally:
        await backend.aclose()
    after = counters(base)

    levels = result.levels
    assert [lv.concurrency for lv in levels] == [1, 2, 4]
    for lv, run in zip(levels, result.runs, strict=True):
        # a request a stream in each repeat; a request that failed says why
        assert 2 <= len(run.repeats) <= 3
        assert lv.completed + lv.failed == lv.concurrency * len(run.repeats)
        assert [r.completed for r in run.repeats] == [lv.concurrency] * len(run.repeats)
        assert lv.failed == 0, [s.error for s in run.samples]
        assert all(m.finish is not None for m in run.metrics)
        done = [m for m in run.metrics if m.ttft_ms is not None]
        # each request's tokens are the server's own count (its `timings`)
        assert lv.total_output_tokens == sum(m.server_predicted_n or -1 for m in done)
        assert lv.total_input_tokens == sum(
            (m.server_prompt_n or 0) + (m.server_cache_n or 0) for m in done
        )
        assert all(m.output_tokens <= 24 for m in done)
    # ... and the whole sweep's (every repeat, no warm-up) are the server's counters over
    # the same time
    out = sum(lv.total_output_tokens for lv in levels)
    assert out == after["tokens_predicted_total"] - before["tokens_predicted_total"]
    prompt_in = sum(lv.total_input_tokens for lv in levels)
    evaluated = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    cached = after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"]
    assert prompt_in == evaluated + cached
    # distinct prompts: a slot's cache serves at most the chat template's opening (with
    # SmolLM2's default system prompt, about half of these short prompts); each request's
    # own tag and task (37-41 tokens with the template's close) are always evaluated, even
    # on a server that ran an earlier sweep (the other tests share this server)
    for run in result.runs:
        assert all((m.evaluated_prompt_tokens or 0) >= 30 for m in run.metrics), [
            (m.prompt_tokens, m.cached_tokens) for m in run.metrics
        ]
    assert evaluated >= 30 * sum(lv.completed for lv in levels)
    # the aggregate rate at 2 and 4 concurrent streams is reported (not judged)
    assert all(lv.output_throughput > 0 for lv in levels[1:])
    assert levels[2].per_user_decode_tok_s is not None
    assert result.knee in (None, 1, 2)
    assert result.warm_up_requests == 0


def test_bench_sweep_json(
    start_llama_server: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    base = start_llama_server(*SERVER_ARGS)
    argv = ["bench", "--backend", "openai", "--base-url", base, "--max-tokens", "8"]
    argv += ["--sweep", "1,2", "--per-stream", "1", "--repeats", "2"]
    argv += ["--slo-ttft-ms", "60000", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["type"] == "sweep" and record["max_tokens"] == 8
    assert record["goodput_slo_ms"] == {"ttft": 60000.0, "tpot": None}
    assert len(record["load_average_1m"]) == 2
    assert [lv["max_concurrency"] for lv in record["levels"]] == [1, 2]
    assert record["warm_up_requests"] == 1 and record["repeats"] == 2
    for lv in record["levels"]:
        assert 2 <= lv["repeats"] == len(lv["repeat_output_throughput"]) <= 4
        assert lv["completed"] + lv["failed"] == lv["max_concurrency"] * lv["repeats"]
        assert lv["p10_output_throughput"] <= lv["median_output_throughput"]
        assert lv["median_output_throughput"] <= lv["p90_output_throughput"]
        assert 0 < lv["total_output_tokens"] <= 8 * lv["completed"]
        assert lv["median_ttft_ms"] <= lv["p99_ttft_ms"]
        # a minute's TTFT limit: every completed request is good
        assert lv["request_goodput"] == pytest.approx(lv["request_throughput"])


def test_bench_sweep_prints_table_and_chart(
    start_llama_server: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    base = start_llama_server(*SERVER_ARGS)
    argv = ["bench", "--backend", "openai", "--base-url", base, "--max-tokens", "8"]
    assert main([*argv, "--sweep", "1,2", "--per-stream", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: plain text
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["conc", "runs", "done", "fail"]
    # the table: a row a level (a flag under it, if any), then the warm-up, named
    end = lines.index("warm-up: 1 request before the first level (not in the figures)")
    rows = [line.split() for line in lines[1:end] if not line.lstrip().startswith("^")]
    assert [row[0] for row in rows] == ["1", "2"] and int(rows[0][1]) == 3  # 3 repeats
    assert "aggregate output tok/s" in out and "concurrent requests" in out
    assert "1 -> 2: aggregate" in out and any(line.startswith("knee: ") for line in lines)
    assert lines[-1].startswith("load average (1 min): ")  # how quiet the figures were


def test_sweep_refuses_the_local_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--sweep", "1,2"]) == 2
    assert "remote backend" in capsys.readouterr().err
