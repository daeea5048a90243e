"""NVIDIA TensorRT-LLM's `trtllm-serve`, read against its source (NVIDIA/TensorRT-LLM,
tensorrt_llm/serve/openai_server.py @e7f7345e; tests/standins/tensorrt_llm.py):
`owned_by: tensorrt_llm` (openai_protocol.py `ModelCard`). The stream's usage carries
`prompt_tokens_details.cached_tokens` (postprocess_handlers.py). Its Prometheus page is
at `/prometheus/metrics`, mounted only when the server runs with `return_perf_metrics`
(`register_routes` -> `mount_metrics`; a 404 otherwise, said once); its `/metrics` is
iteration stats in JSON, not read. With `return_perf_metrics` (and
`perf_metrics_max_requests` > 0) `GET /perf_metrics` gives each finished request's own
record and forgets it (`get_perf_metrics`): its executor's arrival, first scheduling,
first and last token (steady-clock seconds), the HTTP layer's arrival and first token,
and its KV blocks reused and missed. phasechat reads it after each answer: the queue
(arrival to first scheduling), the prefill (to the first token), the decode (to the
last), the server's own time to first token, and the share of the prompt's blocks found
cached. KV-cache reuse is in whole blocks (`tokens_per_block`, 32 by default)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import httpx

from phasechat.backends.events import ServerAccount
from phasechat.backends.remote.servers.family import PromNames, ServerFamily
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.remote.windows import fetch_json
from phasechat.backends.remote.wire_numbers import Fields, as_count, as_ms

SOURCE = "TensorRT-LLM /perf_metrics"
#: how long to wait for the record: it is added after the stream's `[DONE]`
#: (openai_server.py `chat_stream_generator`: `_extract_metrics` after the last chunk)
SETTLE_S = 1.0


def _seconds(timing: dict[str, Any], key: str, f: Fields) -> float | None:
    value = timing.get(key)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        f.ignore(f"perf_metrics.timing_metrics.{key}", value)
        return None
    return float(value)


def _span(timing: dict[str, Any], start: str, end: str, f: Fields) -> float | None:
    """ms from `timing[start]` to `timing[end]` (None: either missing, or not in order)."""
    a, b = _seconds(timing, start, f), _seconds(timing, end, f)
    if a is None or b is None:
        return None
    ms = as_ms((b - a) * 1000)
    if ms is None:
        f.ignore(f"perf_metrics {start} -> {end}", f"{(b - a) * 1000:.3g} ms")
    return ms


def account_of(item: dict[str, Any], f: Fields) -> ServerAccount:
    """One `/perf_metrics` record as an account of the request."""
    perf = item.get("perf_metrics")
    perf = perf if isinstance(perf, dict) else {}
    timing = perf.get("timing_metrics")
    timing = timing if isinstance(timing, dict) else {}
    kv = perf.get("kv_cache_metrics")
    kv = kv if isinstance(kv, dict) else {}
    reused = as_count(kv.get("num_reused_blocks"))
    missed = as_count(kv.get("num_missed_blocks"))
    blocks = (reused or 0) + (missed or 0)
    share = reused / blocks if reused is not None and missed is not None and blocks else None
    return ServerAccount(
        SOURCE,
        queue_ms=_span(timing, "arrival_time", "first_scheduled_time", f),
        prefill_ms=_span(timing, "first_scheduled_time", "first_token_time", f),
        decode_ms=_span(timing, "first_token_time", "last_token_time", f),
        ttft_ms=_span(timing, "server_arrival_time", "server_first_token_time", f),
        kv_hit_share=share,
    )


async def perf_record(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], f: Fields
) -> ServerAccount | None:
    """The record of the request that just ended, from `GET /perf_metrics` (read until
    it is there, for up to SETTLE_S). It gives every request finished since it was last
    read and forgets them: more than one is no request's alone."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        said = await fetch_json(client, "GET", endpoint(root, "/perf_metrics"), headers)
        if not isinstance(said, list):
            return None  # not served (an older server): nothing to say
        items = [x for x in said if isinstance(x, dict)]
        if len(items) == 1:
            return account_of(items[0], f)
        if items:
            why = (
                f"{len(items)} requests' records at /perf_metrics at once: none is this one's alone"
            )
            return ServerAccount(SOURCE, unknown=why)
        if time.monotonic() > deadline:
            return None  # served empty: the server keeps no records (return_perf_metrics off)
        await asyncio.sleep(0.05)


FAMILY = ServerFamily(
    name="TensorRT-LLM",
    owned_by=("tensorrt_llm",),
    metrics=PromNames(
        engine="TensorRT-LLM",
        prefix="trtllm_",
        path="/prometheus/metrics",
        names={
            "running": ("trtllm_num_requests_running", "trtllm_num_requests_waiting"),
            "finished": ("trtllm_e2e_request_latency_seconds_count",),
            "prompt": ("trtllm_prompt_tokens_total",),
            "cached": ("trtllm_prompt_cached_tokens_total",),
            "generated": ("trtllm_generation_tokens_total",),
            "queue_s": ("trtllm_request_queue_time_seconds_sum",),
            "prefill_s": ("trtllm_request_prefill_time_seconds_sum",),
            "decode_s": ("trtllm_request_decode_time_seconds_sum",),
            "ttft_s": ("trtllm_time_to_first_token_seconds_sum",),
        },
        absent=(
            "no Prometheus page (TensorRT-LLM mounts /prometheus/metrics only when it runs "
            "with return_perf_metrics): its queue, prefill and decode are unknown"
        ),
        record=perf_record,
    ),
    cache_grain=32,
    docs="NVIDIA/TensorRT-LLM: tensorrt_llm/serve/openai_server.py, metrics/collector.py",
)
