"""Every field of `Metrics` for two whole answers built by hand, one from a server (vLLM:
usage with its cache and thinking, /metrics' account, a silent end-of-sequence chunk)
and one from the local engine (a wait for the load, llama.cpp's counters, KV, threads).
Each figure is worked out in the comments; the inputs are chosen so that no two
neighbouring formulas (p95 for p99, the answer's window for the decode window, the
prompt for the evaluated tokens, ms for s) give the same answer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from phasechat.backends.events import (
    EngineThreads,
    Finished,
    KVStats,
    ModelLoaded,
    ModelLoading,
    PromptEvaluated,
    ReasoningDelta,
    ResponseStarted,
    ServerAccount,
    ServerTimings,
    TextDelta,
    Usage,
)
from phasechat.telemetry.metrics import compute, metrics_from_dict
from phasechat.telemetry.recorder import Trace

MS = 1_000_000


def vllm_answer() -> Trace:
    t = Trace(
        "remote",
        "m",
        max_tokens=64,
        prompt_estimate=90,
        window=4096,
        window_source="vLLM /v1/models max_model_len",
    )
    t.observe(ResponseStarted(200, connect_ms=1.5), 40 * MS)
    t.observe(ReasoningDelta("think "), 100 * MS)
    t.observe(ReasoningDelta("more "), 115 * MS)
    t.observe(TextDelta("Hello"), 150 * MS)
    t.observe(TextDelta(" world"), 170 * MS)
    t.observe(TextDelta("!"), 200 * MS)
    t.observe(Usage(101, 13, 64, 4), 205 * MS)
    account = ServerAccount(
        "vLLM /metrics",
        prompt_tokens=101,
        cached_tokens=64,
        generated_tokens=13,
        prefill_ms=30.0,
        decode_ms=88.0,
        queue_ms=2.0,
        ttft_ms=90.0,
        pool_tokens=16_000,
        block_tokens=16,
        used_share=0.25,
    )
    t.observe(account, 290 * MS)
    # the end-of-sequence token's chunk at 210 ms, the stream's end at 215 (before the
    # /metrics read)
    t.observe(Finished("stop", 210 * MS, 215 * MS), 300 * MS)
    return t


VLLM: dict[str, Any] = {
    "backend": "remote",
    "model": "m",
    "finish": "stop",
    "ttft_ms": 100.0,
    "ttfo_ms": 150.0,
    "e2e_ms": 215.0,  # the stream's end, not the /metrics read after it
    "first_byte_ms": 40.0,
    "prompt_tokens": 101,
    "prompt_tokens_source": "server",
    "cached_tokens": 64,
    "evaluated_prompt_tokens": 37,
    "output_tokens": 13,  # usage: 5 chunks are not 5 tokens
    "output_tokens_estimated": False,
    "reasoning_tokens": 4,
    "reasoning_tokens_source": "server",
    "reasoning_ms": 50.0,  # first thinking (100) to first answer (150)
    "answer_tokens": 9,
    "prefill_tok_s": pytest.approx(37 / 0.100),  # evaluated over TTFT
    "cache_reported": True,
    # 12 tokens after the first over 100 -> 210 ms (the silent chunk ends the count)
    "decode_tok_s": pytest.approx(12 / 0.110),
    "tpot_ms": pytest.approx(110 / 12),
    # chunk gaps 15, 35, 20, 30: sorted 15 20 30 35
    "itl_ms_p50": pytest.approx(25.0),
    "itl_ms_p95": pytest.approx(30 + 5 * 0.85),
    "itl_ms_p99": pytest.approx(30 + 5 * 0.97),
    "itl_ms_max": 35.0,
    "chars": 12,
    # the answer's 7 characters after its first chunk, over 150 -> 210 ms, 8 tokens
    "chars_per_s": pytest.approx(7 / 0.060),
    "chars_per_token": pytest.approx(7 / 8),
    "prefill_share": pytest.approx(100 / 215),
    "decode_share": pytest.approx(115 / 215),
    "kv_used_tokens": 128,  # 101 + 13 = 114, in whole blocks of 16
    "kv_capacity_tokens": 4096,
    "kv_bytes": None,
    "implied_bandwidth_gb_s": None,
    "server_prompt_n": 37,
    "server_cache_n": 64,
    "server_prompt_ms": 30.0,
    "server_predicted_n": 13,
    "server_predicted_ms": 88.0,
    "server_prefill_tok_s": pytest.approx(37 / 0.030),
    "server_decode_tok_s": pytest.approx(12 / 0.088),  # first to last token, as ours
    "server_draft_n": None,
    "server_draft_accepted": None,
    "draft_acceptance": None,
    "context_window": 4096,
    "context_source": "vLLM /v1/models max_model_len",
    "threads": None,
    "thread_changes": None,
    "threads_reason": None,
    "warnings": [],
    "connect_ms": 1.5,
    "headers_ms": 40.0,
    "time_to_second_token_ms": 115.0,
    "load_ms": None,
    "server_source": "vLLM /metrics",
    "server_ttft_ms": 90.0,
    "server_queue_ms": 2.0,
    "transport_ms": 10.0,  # our TTFT less the server's
    "server_unknown": None,
    "server_kv_pool_tokens": 16_000,
    "server_kv_used_share": 0.25,
    "server_kv_block_tokens": 16,
    "sent_ms": None,
    "server_kv_hit_share": None,
    "server_prefill_worker": None,
    "server_decode_worker": None,
    "server_queue_name": None,
    "server_queue_means": None,
    "server_prefill_name": None,
    "server_prefill_means": None,
    "server_load_ms": None,
    "gpu_bytes_per_token": None,
    "cpu_bytes_per_token": None,
    "decode_unknown": None,
}


def test_every_metric_of_a_vllm_answer() -> None:
    m = compute(vllm_answer())
    assert m.as_dict() == VLLM
    assert m.ttft_ready_ms == 100.0
    assert metrics_from_dict(m.as_dict()) == m  # the database's round trip


def test_an_overlapped_requests_account_gives_no_server_figures() -> None:
    t = vllm_answer()
    t.account = ServerAccount("vLLM /metrics", pool_tokens=16_000, unknown="overlap")
    m = compute(t)
    assert (m.server_source, m.server_prompt_n, m.server_ttft_ms, m.transport_ms) == (None,) * 4
    assert (m.server_unknown, m.server_kv_pool_tokens) == ("overlap", 16_000)
    assert m.server_kv_block_tokens is None and m.kv_used_tokens == 114  # no blocks known


def local_answer() -> Trace:
    t = Trace("local", "m", window=2048, window_source="llama.cpp n_ctx")
    t.observe(ModelLoading(), 1 * MS)
    t.observe(ModelLoaded(t_ns=50 * MS), 55 * MS)
    t.observe(PromptEvaluated(120, 20, 100), 60 * MS)
    t.observe(EngineThreads(4, 8, "load"), 61 * MS)
    for ms in (200, 208, 220):
        t.observe(TextDelta("ab", 1), ms * MS)
    t.observe(EngineThreads(2, 8, "busy neighbour", 3), 221 * MS)
    for ms in (236, 250):
        t.observe(TextDelta("ab", 1), ms * MS)
    t.observe(ServerTimings(100, 80.0, 5, 45.0, 20), 251 * MS)
    t.observe(
        KVStats(125, 2048, 1_000_000, 8_000_000, 99_000_000, 60_000_000, 40_000_000), 252 * MS
    )
    t.observe(Finished("stop"), 260 * MS)
    return t


def test_every_metric_of_a_local_answer_that_waited_for_the_load() -> None:
    m = compute(local_answer())
    expected = {
        "backend": "local",
        "model": "m",
        "finish": "stop",
        "ttft_ms": 200.0,
        "ttfo_ms": 200.0,
        "e2e_ms": 260.0,
        "first_byte_ms": None,
        "prompt_tokens": 120,
        "prompt_tokens_source": "tokenizer",
        "cached_tokens": 20,
        "evaluated_prompt_tokens": 100,
        "output_tokens": 5,
        "output_tokens_estimated": False,
        "reasoning_tokens": None,
        "reasoning_tokens_source": "none",
        "reasoning_ms": None,
        "answer_tokens": 5,
        # 100 evaluated over the TTFT after the 50 ms load: 150 ms
        "prefill_tok_s": pytest.approx(100 / 0.150),
        "cache_reported": True,
        "decode_tok_s": pytest.approx(4 / 0.050),
        "tpot_ms": pytest.approx(12.5),
        # gaps 8, 12, 16, 14: sorted 8 12 14 16
        "itl_ms_p50": pytest.approx(13.0),
        "itl_ms_p95": pytest.approx(14 + 2 * 0.85),
        "itl_ms_p99": pytest.approx(14 + 2 * 0.97),
        "itl_ms_max": 16.0,
        "chars": 10,
        "chars_per_s": pytest.approx(8 / 0.050),
        "chars_per_token": 2.0,
        "prefill_share": pytest.approx(150 / 260),  # from the ready model
        "decode_share": pytest.approx(60 / 260),  # the whole TTFT, load included
        "kv_used_tokens": 125,
        "kv_capacity_tokens": 2048,
        "kv_bytes": 1_000_000,
        # 80 tok/s x (99 MB of weights + 1 MB of KV)
        "implied_bandwidth_gb_s": pytest.approx(80 * 100_000_000 / 1e9),
        "server_prompt_n": 100,
        "server_cache_n": 20,
        "server_prompt_ms": 80.0,
        "server_predicted_n": 5,
        "server_predicted_ms": 45.0,
        "server_prefill_tok_s": pytest.approx(100 / 0.080),
        "server_decode_tok_s": pytest.approx(5 / 0.045),  # llama.cpp counts every token
        "server_draft_n": None,
        "server_draft_accepted": None,
        "draft_acceptance": None,
        "context_window": 2048,
        "context_source": "llama.cpp n_ctx",
        "threads": 2,
        "thread_changes": 1,
        "threads_reason": "busy neighbour",
        "warnings": [],
        "connect_ms": None,
        "headers_ms": None,
        "time_to_second_token_ms": 208.0,
        "load_ms": 50.0,  # the load ended 50 ms after the send (at 0)
        "server_source": "llama.cpp",
        "server_ttft_ms": None,
        "server_queue_ms": None,
        "transport_ms": None,
        "server_unknown": None,
        "server_kv_pool_tokens": None,
        "server_kv_used_share": None,
        "server_kv_block_tokens": None,
        "sent_ms": None,
        "server_kv_hit_share": None,
        "server_prefill_worker": None,
        "server_decode_worker": None,
        "server_queue_name": None,
        "server_queue_means": None,
        "server_prefill_name": None,
        "server_prefill_means": None,
        "server_load_ms": None,
        "gpu_bytes_per_token": 60_000_000,
        "cpu_bytes_per_token": 40_000_000,
        "decode_unknown": None,
    }
    assert m.as_dict() == expected
    assert m.ttft_ready_ms == 150.0


def llama_server_answer(prompt_n: int = 30, window: int | None = None, usage: bool = True) -> Trace:
    t = Trace("remote", "m", max_tokens=8, prompt_estimate=50, prompt_estimate_exact=True)
    t.window = window
    for ms in (100, 110, 125, 145):
        t.observe(TextDelta("a"), ms * MS)
    t.observe(ServerTimings(prompt_n, 20.0, 5, 40.0, 20, 8, 6), 150 * MS)
    if usage:
        t.observe(Usage(50, 5), 150 * MS)
    t.observe(Finished("stop", 155 * MS), 160 * MS)  # the end-of-sequence chunk at 155
    return t


def test_every_metric_of_a_llama_server_answer_with_a_draft_model() -> None:
    m = compute(llama_server_answer())
    changed = {
        "backend": "remote",
        "model": "m",
        "finish": "stop",
        "ttft_ms": 100.0,
        "ttfo_ms": 100.0,
        "e2e_ms": 160.0,
        "prompt_tokens": 50,
        "prompt_tokens_source": "server",
        "cached_tokens": 20,
        "evaluated_prompt_tokens": 30,
        "output_tokens": 5,
        "output_tokens_estimated": False,
        "answer_tokens": 5,
        "prefill_tok_s": pytest.approx(300.0),
        "cache_reported": True,
        # 4 tokens after the first over 100 -> 155 ms (the silent chunk)
        "decode_tok_s": pytest.approx(4 / 0.055),
        "tpot_ms": pytest.approx(55 / 4),
        # gaps 10, 15, 20
        "itl_ms_p50": pytest.approx(15.0),
        "itl_ms_p95": pytest.approx(15 + 5 * 0.9),
        "itl_ms_p99": pytest.approx(15 + 5 * 0.98),
        "itl_ms_max": 20.0,
        "chars": 4,
        "chars_per_s": pytest.approx(3 / 0.055),
        "chars_per_token": pytest.approx(3 / 4),
        "prefill_share": pytest.approx(100 / 160),
        "decode_share": pytest.approx(60 / 160),
        "server_prompt_n": 30,
        "server_cache_n": 20,
        "server_prompt_ms": 20.0,
        "server_predicted_n": 5,
        "server_predicted_ms": 40.0,
        "server_prefill_tok_s": pytest.approx(1500.0),
        "server_decode_tok_s": pytest.approx(125.0),  # llama.cpp's timings: every token
        "server_draft_n": 8,
        "server_draft_accepted": 6,
        "draft_acceptance": 0.75,
        "time_to_second_token_ms": 110.0,
        "server_source": "timings",
    }
    d = m.as_dict()
    assert {k: d[k] for k in changed} == changed
    # the rest is unknown here: no KV, no window, no thinking, no /metrics, no threads
    rest = {k: v for k, v in d.items() if k not in changed}
    assert rest == dict.fromkeys(rest, None) | {
        "reasoning_tokens_source": "none",
        "warnings": [],
    }


def test_a_prompt_cut_by_the_server_is_named_against_its_window() -> None:
    # the server counted 50 prompt tokens but evaluated 10 and reused 20: 30 read
    m = compute(llama_server_answer(prompt_n=10))
    assert m.warnings == (
        "server evaluated + cached 30 of 50 prompt tokens: the prompt was truncated",
    )
    # without its usage: it read 30 of the 50 we sent, and its window is 40
    m = compute(llama_server_answer(prompt_n=10, window=40, usage=False))
    assert m.warnings == (
        "the server's window is 40 tokens; we sent 50 prompt tokens and it read 30: "
        "the prompt was truncated",
    )
    assert (m.prompt_tokens, m.output_tokens, m.kv_used_tokens) == (30, 5, 35)
    # a window we do not know: 30 of 50 is over half, not called truncated; 20 is under
    assert compute(llama_server_answer(prompt_n=10, usage=False)).warnings == ()
    assert compute(llama_server_answer(prompt_n=0, usage=False)).warnings == (
        "server read 20 prompt tokens, we sent 50: the prompt was probably truncated",
    )


def test_a_server_read_of_exactly_half_the_prompt_is_not_called_truncated() -> None:
    # 5 evaluated + 20 cached = 25 of the 50 sent: at the share, not under it
    assert compute(llama_server_answer(prompt_n=5, usage=False)).warnings == ()
    assert compute(llama_server_answer(prompt_n=4, usage=False)).warnings == (
        "server read 24 prompt tokens, we sent 50: the prompt was probably truncated",
    )


def test_a_server_ttft_equal_to_ours_leaves_no_time_to_the_transport() -> None:
    t = vllm_answer()
    assert t.account is not None
    t.account = replace(t.account, ttft_ms=100.0)  # our TTFT is 100 ms too
    assert compute(t).transport_ms == 0.0
    t.account = replace(t.account, ttft_ms=100.5)  # the server's clock says more: unknown
    assert compute(t).transport_ms is None


def test_an_answer_without_a_token_event_is_counted_by_the_servers_usage() -> None:
    # the stream sent no text at all (say, a tool call the client does not show), yet
    # the server generated 5 tokens
    t = Trace("remote", "m")
    t.observe(Usage(10, 5), 100 * MS)
    t.observe(Finished("stop"), 101 * MS)
    m = compute(t)
    assert (m.output_tokens, m.output_tokens_estimated, m.answer_tokens) == (5, False, 5)
    assert (m.ttft_ms, m.decode_tok_s, m.chars, m.itl_ms_p50) == (None, None, 0, None)


def test_a_record_from_an_older_version_loads_with_defaults() -> None:
    m = metrics_from_dict({"ttft_ms": 12.5, "unknown_key": 1, "warnings": ["w"]})
    assert (m.backend, m.model, m.finish, m.ttft_ms) == ("", "", None, 12.5)
    assert (m.output_tokens, m.chars, m.output_tokens_estimated) == (0, 0, False)
    assert (m.prompt_tokens_source, m.reasoning_tokens_source) == ("none", "none")
    assert (m.cache_reported, m.warnings, m.load_ms) == (True, ("w",), None)
    assert metrics_from_dict({"cache_reported": False}).cache_reported is False
    assert m.ttft_ready_ms == 12.5
    assert metrics_from_dict({"ttft_ms": 10.0, "load_ms": 25.0}).ttft_ready_ms == 0.0
