"""TGI's router (huggingface/text-generation-inference), stood in for from its source (it
needs a GPU or its own Rust build), read at
huggingface/text-generation-inference@db931fcf42da018a3657580c64bf2720f167f9ab:
- SERVER router/src/server.rs, CHAT router/src/chat.rs, LIB router/src/lib.rs,
  QUEUE backends/v3/src/queue.rs, BACKEND backends/v3/src/backend.rs.

Each behaviour below names the file and function it copies. What it leaves out: tools
and grammars, logprobs, best_of, the validation refusals (422), the keep-alive comments
of a stream quiet for 15 s (`KeepAlive::default`), and the Prometheus listener on its
own port (`with_http_listener`; the same page is at `/metrics` on the main port). It is
a FastAPI app where TGI is axum: the HTTP framing (chunked, keep-alive) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.standins.base import StandIn
from tests.standins.engine import Run, ToyEngine, chat_prompt
from tests.standins.prom import Page

COMMIT = "huggingface/text-generation-inference@db931fcf42da018a3657580c64bf2720f167f9ab"
VERSION = "3.3.6-dev0"  # Cargo.toml [workspace.package] version


@dataclass
class Sent:
    """What the stand-in measured of one request (seconds), as its /metrics records it."""

    prompt_tokens: int
    completion_tokens: int
    validation_s: float
    queue_s: float
    inference_s: float
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class TGI(StandIn):
    """`text-generation-launcher --model-id ... --max-total-tokens N`."""

    model_id: str = "HuggingFaceTB/SmolLM2-360M-Instruct"
    max_input_tokens: int = 4095
    max_total_tokens: int = 4096
    engine: ToyEngine = field(default_factory=ToyEngine)

    def __post_init__(self) -> None:
        self.page = metrics_page()
        self.app = self.new_app()
        # SERVER: .route("/info", ...), .route("/metrics", ...), .route("/v1/models", ...)
        self.app.get("/info")(self.info)
        self.app.get("/v1/models")(self.models)
        self.app.get("/metrics")(self.metrics)
        self.app.post("/v1/chat/completions")(self.chat)

    async def info(self) -> dict[str, Any]:
        # SERVER get_model_info: LIB `Info` as it is
        return {
            "model_id": self.model_id,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": 128,
            "max_best_of": 2,
            "max_stop_sequences": 4,
            "max_input_tokens": self.max_input_tokens,
            "max_total_tokens": self.max_total_tokens,
            "validation_workers": 2,
            "max_client_batch_size": 4,
            "router": "text-generation-router",
            "version": VERSION,
            "sha": None,
            "docker_label": None,
        }

    async def models(self) -> dict[str, Any]:
        # SERVER openai_get_model_info: the model id is its own owner, created 0
        # (ModelsInfo's default object "list")
        card = {"id": self.model_id, "object": "model", "created": 0, "owned_by": self.model_id}
        return {"object": "list", "data": [card]}

    async def metrics(self) -> Response:
        # SERVER metrics: prom_handle.render()
        return Response(self.page.text(), media_type="text/plain")

    async def chat(self, request: Request) -> Response:
        start_time = time.monotonic()  # SERVER generate_stream_internal: start_time
        body = await request.json()
        self.bodies.append(body)
        # SERVER chat_completions counts the request, then generate_stream_internal again
        self.page.inc("tgi_request_count", 2)
        if not body.get("stream"):
            return JSONResponse({"error": "the stand-in streams only"}, status_code=501)
        # SERVER chat_completions: model "tgi" or none is the served model
        model_id = body.get("model")
        model_id = self.model_id if model_id in (None, "tgi") else model_id
        prompt = chat_prompt(body["messages"])
        run = self.engine.plan(body["messages"], int(body.get("max_tokens") or 100))
        # validation.rs: the input length, recorded as it is validated
        self.page.observe("tgi_request_input_length", len(run.prompt))
        # SERVER generate_stream_internal: the headers of a stream (no timings: those are
        # set only by generate_internal, for a reply sent whole)
        headers = {
            "x-compute-type": "gpu+optimized",  # COMPUTE_TYPE's default
            "x-compute-characters": str(len(prompt)),
            "X-Accel-Buffering": "no",
        }
        # axum's Sse: the response (and its headers) leaves at once, before any token
        return StreamingResponse(
            self._stream(body, run, model_id, start_time, headers),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )

    async def _stream(
        self,
        body: dict[str, Any],
        run: Run,
        model_id: str,
        start_time: float,
        headers: dict[str, str],
    ) -> AsyncIterator[str]:
        fingerprint = f"{VERSION}-native"  # SERVER chat_completions: version-docker_label
        queued = time.monotonic()  # the entry joins the queue
        self.page.set("tgi_queue_size", 1)  # QUEUE: increment(1.0) on append
        await asyncio.sleep(self.engine.schedule_s)
        start = time.monotonic()  # the batch that holds it starts
        self.page.set("tgi_queue_size", 0)  # QUEUE next_batch: set(entries.len())
        self.page.set("tgi_batch_current_size", 1)  # BACKEND batching_task
        await asyncio.sleep(self.engine.prefill_time(run))
        # a natural end is one more token, the end-of-sequence token (counted, special)
        tokens = [*run.answer, ""] if run.finish == "stop" else run.answer
        for i, piece in enumerate(tokens[:-1]):
            if i:
                await asyncio.sleep(self.engine.decode_s)
            yield _event(_chunk(model_id, fingerprint, piece, None))  # Intermediate
        await asyncio.sleep(self.engine.decode_s)
        # InferStreamResponse::End: the timings and the metrics, then the last token
        # with its finish reason (CHAT create_event_from_stream_token: a special token's
        # content is ""; LIB FinishReason::format: end-of-sequence is "stop")
        total = time.monotonic() - start_time
        inference = time.monotonic() - start
        generated = len(tokens)
        for name, value in (
            ("tgi_request_duration", total),
            ("tgi_request_validation_duration", queued - start_time),
            ("tgi_request_queue_duration", start - queued),
            ("tgi_request_inference_duration", inference),
            ("tgi_request_mean_time_per_token_duration", inference / generated),
            ("tgi_request_generated_tokens", generated),
        ):
            self.page.observe(name, value)
        self.page.inc("tgi_request_success")
        self.page.set("tgi_batch_current_size", 0)  # BACKEND: the batch is done
        self.engine.remember(run)
        said = Sent(len(run.prompt), generated, queued - start_time, start - queued, inference)
        said.headers = headers
        self.sent.append(said)
        yield _event(_chunk(model_id, fingerprint, tokens[-1], run.finish))
        # CHAT ChatState::push: with stream_options.include_usage, a chunk of usage (id
        # "", choices []) after the last token's; no cached tokens in it (LIB `Usage`)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(run.prompt),
                "completion_tokens": generated,
                "total_tokens": len(run.prompt) + generated,
            }
            chunk = {
                "object": "chat.completion.chunk",
                "id": "",
                "created": int(time.time()),
                "model": model_id,
                "system_fingerprint": fingerprint,
                "choices": [],
                "usage": usage,
            }
            yield _event(chunk)
        yield "data: [DONE]\n\n"


def _chunk(model_id: str, fingerprint: str, text: str, finish: str | None) -> dict[str, Any]:
    """CHAT create_event_from_stream_token: LIB `CompletionType` tagged by `object`, a
    `ChatCompletionChunk` with id "", every delta a `TextMessage` with its role."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish,
    }
    return {
        "object": "chat.completion.chunk",
        "id": "",
        "created": int(time.time()),
        "model": model_id,
        "system_fingerprint": fingerprint,
        "choices": [choice],
        "usage": None,
    }


def _event(obj: dict[str, Any]) -> str:
    """axum `Event::default().json_data(...)`."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def metrics_page() -> Page:
    """SERVER run: the names phasechat reads, as metrics-exporter-prometheus renders them
    (no labels, counters without `_total`, histograms with the buckets set for them)."""
    page = Page({})
    page.counter("tgi_request_count", "Number of inference requests")
    page.counter("tgi_request_success", "Number of successful requests")
    page.gauge("tgi_queue_size", "Current queue size")
    page.gauge("tgi_batch_current_size", "Current batch size")
    seconds = tuple(0.0001 * 1.5**i for i in range(1, 36))  # SERVER: duration buckets
    for name in (
        "tgi_request_duration",
        "tgi_request_validation_duration",
        "tgi_request_queue_duration",
        "tgi_request_inference_duration",
        "tgi_request_mean_time_per_token_duration",
    ):
        page.histogram(name, "Request duration", seconds)
    page.histogram("tgi_request_input_length", "Input tokens per request", (64.0, 512.0, 4095.0))
    page.histogram("tgi_request_generated_tokens", "Generated tokens per request", (64.0, 4096.0))
    return page
