"""SGLang's OpenAI-compatible server, stood in for from its source (it needs a GPU).

Read at sgl-project/sglang, each file at the commit of its stored version, under
python/sglang/srt/:
- SERVING_CHAT entrypoints/openai/serving_chat.py @002897c23becbd522d88b8115a763a21765f978a
- SSE_UTILS entrypoints/openai/sse_utils.py @0671305890f954d76e23532a5adf66f350cb8baf
- PROTOCOL entrypoints/openai/protocol.py @004c82e07d876f6e4a0ad6e15325706b0f478f1a
- USAGE entrypoints/openai/usage_processor.py @056c7ec2bdc0f1ddaf4d255a0076501a742c34bc
- COLLECTOR metrics/collector.py @00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538

Each behaviour below names the file and function it copies. What it leaves out: tools,
reasoning parsers, logprobs, n > 1, hidden states, routed experts, multimodal counts,
the scheduler's batching (one request at a time here).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.standins.base import StandIn
from tests.standins.engine import Run, ToyEngine
from tests.standins.prom import Page

COMMIT = "sgl-project/sglang@002897c23becbd522d88b8115a763a21765f978a"
#: the token id a natural stop matched (Qwen2's <|im_end|>), as `matched_stop` gives it
EOS_ID = 151645


@dataclass
class Sent:
    """What the stand-in said of one request, for a test to hold phasechat's figures
    against: its own queue and time to first token (seconds), and its cache."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    details: dict[str, int] | None = None
    usage: dict[str, Any] | None = None


@dataclass
class SGLang(StandIn):
    """`python -m sglang.launch_server` with `--enable-metrics` and `--enable-cache-report`
    where set. `details_override` replaces the `cached_tokens_details` a request gets
    (a server that says more is cached than the prompt had)."""

    enable_metrics: bool = True
    enable_cache_report: bool = True
    context_length: int = 4096
    model_path: str = "Qwen/Qwen2.5-0.5B-Instruct"
    engine: ToyEngine = field(default_factory=ToyEngine)
    details_override: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.page = metrics_page(self.model_path)
        self.app = self.new_app()
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/chat/completions")(self.chat)
        if self.enable_metrics:
            # entrypoints/http_server.py @9c0549b727fe222444495cea6b369697534d60f0: only
            # `if server_args.enable_metrics: add_prometheus_middleware(app)` mounts
            # /metrics (utils/common.py: a MultiProcessCollector; a 404 without)
            self.app.get("/metrics")(self.metrics)

    async def models(self) -> dict[str, Any]:
        # PROTOCOL ModelCard / ModelList: owned_by "sglang", root, parent None, and
        # max_model_len the context length it serves
        card = {
            "id": self.model_path,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.model_path,
            "parent": None,
            "max_model_len": self.context_length,
        }
        return {"object": "list", "data": [card]}

    async def metrics(self) -> Response:
        return Response(self.page.text(), media_type="text/plain; version=0.0.4")

    async def chat(self, request: Request) -> Response:
        received = time.monotonic()  # serving_base _serve: received_time
        body = await request.json()
        self.bodies.append(body)
        stream = bool(body.get("stream"))
        # SERVING_CHAT _validate_request
        if not body.get("messages"):
            return _error("Messages cannot be empty.")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens and max_tokens > self.context_length:
            return _error(
                f"max_completion_tokens is too large: {max_tokens}.This model supports at "
                f"most {self.context_length} completion tokens."
            )
        # SERVING_CHAT _convert_to_internal_request: a ValueError, which serving_base's
        # handle_request answers as a 400
        if stream and body.get("return_prompt_token_ids"):
            return _error(
                "return_prompt_token_ids is not supported with streaming. Please set "
                "stream=false when using return_prompt_token_ids=true."
            )
        if stream and body.get("return_meta_info"):
            return _error(
                "return_meta_info is not supported with streaming. Please set "
                "stream=false when using return_meta_info=true."
            )
        if not stream:
            return _error("the stand-in streams only", 501)
        run = self.engine.plan(body["messages"], int(max_tokens or 128))
        # COLLECTOR SchedulerMetricsCollector: queue_time_seconds, from the waiting
        # queue to the first forward pass (TimeStats.get_queueing_time)
        queued = time.monotonic()
        self.page.set("sglang:num_queue_reqs", 1)
        await asyncio.sleep(self.engine.schedule_s)
        queue_s = time.monotonic() - queued
        self.page.observe("sglang:queue_time_seconds", queue_s)
        self.page.set("sglang:num_queue_reqs", 0)
        self.page.set("sglang:num_running_reqs", 1)
        await asyncio.sleep(self.engine.prefill_time(run))
        # COLLECTOR TokenizerMetricsCollector.observe_time_to_first_token: from the
        # request's receipt to its first output
        ttft_s = time.monotonic() - received
        self.page.observe("sglang:time_to_first_token_seconds", ttft_s)
        sent = Sent(len(run.prompt), run.cached, len(run.answer), queue_s, ttft_s)
        self.sent.append(sent)
        # SERVING_CHAT _handle_streaming_request: the first chunk is awaited before the
        # 200 is sent, so the headers leave with the first token
        return StreamingResponse(
            self._stream(body, run, sent, received), media_type="text/event-stream"
        )

    async def _stream(
        self, body: dict[str, Any], run: Run, sent: Sent, received: float
    ) -> AsyncIterator[str]:
        """SERVING_CHAT _generate_chat_stream, for one choice."""
        rid = uuid.uuid4().hex  # meta_info["id"]
        model = body.get("model") or "default"  # PROTOCOL DEFAULT_MODEL_NAME
        created = int(time.time())
        # the role chunk: build_sse_content(role="assistant", content="")
        yield _sse_content(rid, created, model, role="assistant", content="")
        for i, piece in enumerate(run.answer):
            if i:
                await asyncio.sleep(self.engine.decode_s)
            yield _sse_content(rid, created, model, content=piece)  # _generate_stream_content
        # COLLECTOR TokenizerMetricsCollector.observe_one_finished_request: counters move
        # as the request finishes; cached_tokens_total only when some were cached
        self.page.inc("sglang:prompt_tokens_total", len(run.prompt))
        self.page.inc("sglang:generation_tokens_total", len(run.answer))
        if run.cached > 0:
            self.page.inc("sglang:cached_tokens_total", run.cached)
        self.page.inc("sglang:num_requests_total")
        self.page.observe("sglang:e2e_request_latency_seconds", time.monotonic() - received)
        self.page.set("sglang:num_running_reqs", 0)
        self.engine.remember(run)
        # the finish chunk: finish_reason and matched_stop (the EOS id, or None for length)
        matched = EOS_ID if run.finish == "stop" else None
        yield _sse_content(rid, created, model, finish_reason=run.finish, matched_stop=matched)
        # the sglext chunk, only when the request asked return_cached_tokens_details:
        # choices [], usage null (ChatCompletionStreamResponse), CachedTokensDetails
        # device and host (storage only with an L3 backend: left out here)
        if body.get("return_cached_tokens_details"):
            details = self.details_override or {"device": run.cached, "host": 0}
            sent.details = details
            ext = _response_chunk(
                rid, created, model, usage=None, sglext={"cached_tokens_details": details}
            )
            yield f"data: {json.dumps(ext)}\n\n"
        # the usage chunk, where stream_options.include_usage (should_include_usage);
        # USAGE calculate_streaming_usage: prompt_tokens_details only with
        # --enable-cache-report and more than 0 cached (_details_if_cached)
        if (body.get("stream_options") or {}).get("include_usage"):
            cached = (
                {"cached_tokens": run.cached}
                if self.enable_cache_report and run.cached > 0
                else None
            )
            usage = {
                "prompt_tokens": len(run.prompt),
                "total_tokens": len(run.prompt) + len(run.answer),
                "completion_tokens": len(run.answer),
                "prompt_tokens_details": cached,
                "reasoning_tokens": 0,
            }
            sent.usage = usage
            chunk = _response_chunk(rid, created, model, usage=usage)
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"


def _response_chunk(rid: str, created: int, model: str, **fields: object) -> dict[str, Any]:
    """PROTOCOL ChatCompletionStreamResponse at response level (`choices: []`), with
    `fields` (`usage` always: None is written as null; `sglext` only when set)."""
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    return {**head, "choices": [], **fields}


def _sse_content(
    rid: str,
    created: int,
    model: str,
    *,
    role: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
) -> str:
    """SSE_UTILS build_sse_content: StreamDelta omits its None fields (omit_defaults);
    StreamChoice does not (logprobs, finish_reason, matched_stop are null); StreamChunk
    omits a None usage."""
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    choice = {
        "index": 0,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


def _error(message: str, status: int = 400) -> JSONResponse:
    """serving_base create_error_response: PROTOCOL ErrorResponse (object "error",
    message, type, param, code) with the status; a ValueError is "BadRequest", 400."""
    kind = "BadRequest" if status == 400 else "NotImplementedError"
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return JSONResponse(body, status_code=status)


def metrics_page(model: str) -> Page:
    """COLLECTOR: the names phasechat reads, each as SchedulerMetricsCollector and
    TokenizerMetricsCollector declare it (labels reduced to model_name)."""
    page = Page({"model_name": model})
    page.gauge("sglang:num_running_reqs", "The number of running requests.")
    page.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
    page.histogram(
        "sglang:queue_time_seconds",
        "Histogram of queueing time in seconds.",
        (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
    )
    page.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.")
    page.counter("sglang:generation_tokens_total", "Number of generation tokens processed.")
    page.counter("sglang:cached_tokens_total", "Number of cached prompt tokens.")
    page.counter("sglang:num_requests_total", "Number of requests processed.")
    page.histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0),
    )
    page.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0),
    )
    return page
