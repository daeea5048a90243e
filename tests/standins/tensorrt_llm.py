"""TensorRT-LLM's `trtllm-serve`, stood in for from its source (it needs an NVIDIA GPU),
read at NVIDIA/TensorRT-LLM, each file at the commit of its stored version:
- SERVER tensorrt_llm/serve/openai_server.py @e7f7345e31e574b5d0918b756b871882c7346b3c
- POSTPROC tensorrt_llm/serve/postprocess_handlers.py @7b437aaa73bf5a44b1102aee5c631074da763b8f
- COLLECTOR tensorrt_llm/metrics/collector.py @050f80def8df236e326949c8bd9dee10fd896a83
- PROTOCOL tensorrt_llm/serve/openai_protocol.py (ModelCard, UsageInfo)

Each behaviour below names the file and function it copies. What it leaves out: the
iteration stats at `/metrics` (an empty list here), tools, reasoning parsers, logprobs,
continuous usage stats, disaggregated serving (its steady-clock offset is 0), the
Responses API, and the prometheus-fastapi-instrumentator's HTTP metrics.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tests.standins.base import StandIn
from tests.standins.engine import Run, ToyEngine
from tests.standins.prom import Page

COMMIT = "NVIDIA/TensorRT-LLM@e7f7345e31e574b5d0918b756b871882c7346b3c"
BLOCK = 32  # tokens_per_block, its default


@dataclass
class Sent:
    """What the stand-in recorded of one request: its /perf_metrics item and its cache."""

    item: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int


@dataclass
class TensorRTLLM(StandIn):
    """`trtllm-serve MODEL` with `return_perf_metrics` (and `perf_metrics_max_requests`)
    in its extra LLM API options where set."""

    model: str = "TinyLlama-1.1B-Chat-v1.0"
    return_perf_metrics: bool = True
    perf_metrics_max_requests: int = 100
    engine: ToyEngine = field(default_factory=lambda: ToyEngine(page=BLOCK))

    def __post_init__(self) -> None:
        self.page = metrics_page()
        self.records: list[dict[str, Any]] = []  # SERVER: the perf_metrics deque
        self.request_ids = 0
        self.app = self.new_app()
        # SERVER register_routes
        self.app.get("/v1/models")(self.models)
        self.app.get("/version")(self.version)
        self.app.get("/metrics")(self.iteration_stats)
        self.app.get("/perf_metrics")(self.perf_metrics)
        self.app.post("/v1/chat/completions")(self.chat)
        if self.return_perf_metrics:  # SERVER register_routes -> mount_metrics
            self.app.get("/prometheus/metrics")(self.prometheus)

    async def models(self) -> dict[str, Any]:
        # SERVER get_model: ModelList(data=[ModelCard(id=self.model)]), owned_by its default
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "tensorrt_llm",
        }
        return {"object": "list", "data": [card]}

    async def version(self) -> dict[str, str]:
        return {"version": "1.2.0"}

    async def iteration_stats(self) -> list[Any]:
        return []  # SERVER get_iteration_stats: JSON, not Prometheus (left empty here)

    async def prometheus(self) -> Response:
        return Response(self.page.text(), media_type="text/plain; version=0.0.4")

    async def perf_metrics(self) -> list[dict[str, Any]]:
        # SERVER get_perf_metrics: [] without the deque; else its items, and it is emptied
        if not self.return_perf_metrics or self.perf_metrics_max_requests <= 0:
            return []
        items, self.records = self.records, []
        return items

    async def chat(self, request: Request) -> Response:
        arrival = time.monotonic()  # ServerArrivalTimeMiddleware: server_arrival_time
        body = await request.json()
        self.bodies.append(body)
        run = self.engine.plan(body["messages"], int(body.get("max_tokens") or 128))
        # SERVER openai_chat: the stream is returned at once (headers before any token)
        return StreamingResponse(self._stream(body, run, arrival), media_type="text/event-stream")

    async def _stream(self, body: dict[str, Any], run: Run, arrival: float) -> AsyncIterator[str]:
        """SERVER chat_stream_generator with POSTPROC chat_stream_post_processor."""
        self.request_ids += 1
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        model = body.get("model")
        created = int(time.time())
        options = body.get("stream_options") or {}
        executor_arrival = time.monotonic()  # timing_metrics.arrival_time
        await asyncio.sleep(self.engine.schedule_s)
        scheduled = time.monotonic()  # first_scheduled_time
        self.page.set("trtllm_num_requests_running", 1)
        await asyncio.sleep(self.engine.prefill_time(run))
        first_token = time.monotonic()  # first_token_time
        server_first_token = time.monotonic()  # raw_request.state.server_first_token_time
        # the first response: a chunk with the role (exclude_none; a space before the
        # blank line, as the source writes it)
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        yield f"data: {json.dumps(first)} \n\n"
        for i, piece in enumerate(run.answer):
            if i:
                await asyncio.sleep(self.engine.decode_s)
            choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}}
            if i == len(run.answer) - 1:
                choice["finish_reason"] = run.finish
            yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
        last_token = time.monotonic()  # last_token_time
        # the usage chunk where include_usage: prompt_tokens_details always (cached_tokens)
        if options.get("include_usage"):
            usage = {
                "prompt_tokens": len(run.prompt),
                "total_tokens": len(run.prompt) + len(run.answer),
                "completion_tokens": len(run.answer),
                "prompt_tokens_details": {"cached_tokens": run.cached},
            }
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"
        # SERVER _extract_metrics, after [DONE]: the collector's histograms and counters,
        # and the request's record for /perf_metrics
        self.engine.remember(run)
        self.page.set("trtllm_num_requests_running", 0)
        for name, value in (
            ("trtllm_e2e_request_latency_seconds", last_token - arrival),
            ("trtllm_time_to_first_token_seconds", first_token - executor_arrival),
            ("trtllm_request_queue_time_seconds", scheduled - executor_arrival),
            ("trtllm_request_prefill_time_seconds", first_token - scheduled),
            ("trtllm_request_decode_time_seconds", last_token - first_token),
        ):
            self.page.observe(name, value)
        self.page.inc("trtllm_request_success_total")
        self.page.inc("trtllm_prompt_tokens_total", len(run.prompt))
        self.page.inc("trtllm_generation_tokens_total", len(run.answer))
        self.page.inc("trtllm_prompt_cached_tokens_total", run.cached)
        reused = run.cached // BLOCK
        item = {
            "request_id": self.request_ids,
            "perf_metrics": {
                "first_iter": 1,
                "last_iter": len(run.answer),
                "timing_metrics": {
                    "server_arrival_time": arrival,
                    "arrival_time": executor_arrival,
                    "first_scheduled_time": scheduled,
                    "first_token_time": first_token,
                    "server_first_token_time": server_first_token,
                    "last_token_time": last_token,
                },
                "kv_cache_metrics": {
                    "num_total_allocated_blocks": math.ceil(len(run.prompt) / BLOCK),
                    "num_new_allocated_blocks": math.ceil((len(run.prompt) - run.cached) / BLOCK),
                    "num_reused_blocks": reused,
                    "num_missed_blocks": math.ceil((len(run.prompt) - run.cached) / BLOCK),
                },
            },
        }
        self.sent.append(Sent(item, len(run.prompt), run.cached))
        if self.return_perf_metrics and self.perf_metrics_max_requests > 0:
            self.records.append(item)


def metrics_page() -> Page:
    """COLLECTOR MetricsCollector: the names phasechat reads, labelled as the server
    labels them ({"model_name": "undefined", "engine_type": "undefined"})."""
    page = Page({"model_name": "undefined", "engine_type": "undefined"})
    page.counter("trtllm_request_success_total", "Count of successfully processed requests.")
    seconds = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
    for name in (
        "trtllm_e2e_request_latency_seconds",
        "trtllm_time_to_first_token_seconds",
        "trtllm_request_queue_time_seconds",
        "trtllm_request_prefill_time_seconds",
        "trtllm_request_decode_time_seconds",
    ):
        page.histogram(name, "Histogram of request time in seconds.", seconds)
    page.counter("trtllm_prompt_tokens_total", "Cumulative number of prompt tokens processed.")
    page.counter("trtllm_generation_tokens_total", "Cumulative number of generation tokens.")
    page.counter("trtllm_prompt_cached_tokens_total", "Cumulative number of cached tokens.")
    page.gauge("trtllm_num_requests_running", "Number of active requests")
    page.gauge("trtllm_num_requests_waiting", "Number of queued requests")
    return page
