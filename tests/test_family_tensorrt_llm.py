"""TensorRT-LLM (backends/remote/servers/tensorrt_llm.py) against a stand-in written from its
source (tests/standins/tensorrt_llm.py, NVIDIA/TensorRT-LLM@e7f7345e): a two-turn chat
through the real backend and session. With `return_perf_metrics` each request's own
record at `/perf_metrics` gives its queue, prefill, decode and time to first token, and
its Prometheus page is at `/prometheus/metrics`; without it that page is a 404, said once
with the reason, and the server's parts are unknown."""

from __future__ import annotations

import pytest

from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST
from tests.standins import serve
from tests.standins.chat import chat
from tests.standins.tensorrt_llm import BLOCK, TensorRTLLM

ABSENT = "TensorRT-LLM mounts /prometheus/metrics only when it runs with return_perf_metrics"


def ms(timing: dict[str, float], start: str, end: str) -> float:
    return (timing[end] - timing[start]) * 1000


async def test_a_two_turn_chat_shows_each_requests_own_record() -> None:
    with serve(TensorRTLLM) as server:
        answers, _ = await chat(server.base_url)
        said = server.record()
    paths = said["paths"]
    assert paths.count("/perf_metrics") >= 2 and paths.count("/prometheus/metrics") >= 3
    assert "/metrics" not in paths  # its iteration stats, in JSON: not read
    for answer, sent in zip(answers, said["sent"], strict=True):
        t = sent["item"]["perf_metrics"]["timing_metrics"]
        kv = sent["item"]["perf_metrics"]["kv_cache_metrics"]
        m, wf = answer.metrics, answer.waterfall
        assert m.server_source == "TensorRT-LLM /perf_metrics + TensorRT-LLM /prometheus/metrics"
        assert m.server_unknown is None and not m.warnings
        assert (m.prompt_tokens, m.cached_tokens) == (sent["prompt_tokens"], sent["cached_tokens"])
        queue = ms(t, "arrival_time", "first_scheduled_time")
        prefill = ms(t, "first_scheduled_time", "first_token_time")
        ttft = ms(t, "server_arrival_time", "server_first_token_time")
        assert m.server_queue_ms == pytest.approx(queue)
        assert m.server_prompt_ms == pytest.approx(prefill)
        assert m.server_predicted_ms == pytest.approx(ms(t, "first_token_time", "last_token_time"))
        assert m.server_ttft_ms == pytest.approx(ttft)
        blocks = kv["num_reused_blocks"] + kv["num_missed_blocks"]
        assert m.server_kv_hit_share == pytest.approx(kv["num_reused_blocks"] / blocks)
        assert wf is not None and wf.contradiction is None, wf
        assert wf.ms(QUEUED) == pytest.approx(queue) and wf.ms(PREFILL) == pytest.approx(prefill)
        assert wf.ms(OTHER) == pytest.approx(ttft - queue - prefill)
        rest = wf.ms(REST)
        assert rest is not None and rest >= 0
    second = said["sent"][1]
    assert second["cached_tokens"] > 0 and second["cached_tokens"] % BLOCK == 0


async def test_without_return_perf_metrics_the_missing_page_is_said_once() -> None:
    with serve(TensorRTLLM, return_perf_metrics=False) as server:
        answers, _ = await chat(server.base_url)
        said = server.record()
    assert said["paths"].count("/prometheus/metrics") == 1  # asked at start: a 404
    assert "/perf_metrics" not in said["paths"]  # it keeps none without the option
    first, second = (a.metrics for a in answers)
    assert [w for w in first.warnings if ABSENT in w] != []
    assert not any(ABSENT in w for w in second.warnings)  # once
    for m, sent in zip((first, second), said["sent"], strict=True):
        assert m.server_queue_ms is None and m.server_ttft_ms is None
        assert m.cached_tokens == sent["cached_tokens"]  # the usage still says it


async def test_a_server_that_keeps_no_records_is_not_asked_again() -> None:
    """`return_perf_metrics` with `perf_metrics_max_requests` 0: /perf_metrics is an
    empty list; after one answer finds none it is not asked again, and the account is
    the Prometheus page's."""
    with serve(TensorRTLLM, perf_metrics_max_requests=0) as server:
        answers, _ = await chat(server.base_url)
        said = server.record()
    assert said["paths"].count("/perf_metrics") > 1  # read until it settled, the first time
    last = max(i for i, p in enumerate(said["paths"]) if p == "/perf_metrics")
    assert last < said["paths"].index("/v1/chat/completions", last)  # not after the second
    for answer in answers:
        m = answer.metrics
        assert m.server_source == "TensorRT-LLM /prometheus/metrics" and m.server_unknown is None
        assert m.server_queue_ms is not None and m.server_prompt_ms is not None
