"""Ollama's server, stood in for from its source, read at
ollama/ollama@fb30760996871fa9460115c753afd2c60d4ab0f7:
- ROUTES server/routes.go, TYPES api/types.go, OPENAI openai/openai.go,
  LLAMA llm/llama_server.go (the runner is llama.cpp's server), NAME types/model/name.go.

Each behaviour below names the file and function it copies. What it leaves out: the
OpenAI-compatible `/v1/chat/completions` (ChatMiddleware: phasechat talks to Ollama on
`/api/chat`), tools, images, thinking, `keep_alive` and unloading, the cloud passthrough,
the refusals of a missing model (404) or a bad body (400). It is a FastAPI app where
Ollama is gin: the HTTP framing (chunked, keep-alive) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.standins.base import StandIn
from tests.standins.engine import Run, ToyEngine

COMMIT = "ollama/ollama@fb30760996871fa9460115c753afd2c60d4ab0f7"


@dataclass
class Sent:
    """The final message's account of one answer, as it was sent (nanoseconds)."""

    final: dict[str, Any]
    cached_tokens: int


def namespace(name: str) -> str:
    """NAME ParseName(...).Namespace: "library" unless the name says `user/model` (or
    `host/user/model`)."""
    parts = name.split(":")[0].split("/")
    return parts[-2] if len(parts) >= 2 else "library"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Ollama(StandIn):
    """`ollama serve` with one model pulled (`model`), loaded on its first request
    (`load_s`); `num_ctx` set in its Modelfile where given (then in /api/show)."""

    model: str = "smollm2:135m"
    num_ctx: int | None = None
    context_length: int = 4096  # what the runner was started with (OLLAMA_CONTEXT_LENGTH)
    load_s: float = 0.25
    engine: ToyEngine = field(default_factory=ToyEngine)

    def __post_init__(self) -> None:
        self.engine.load_s = self.load_s
        self.modified = int(time.time()) - 3600
        self.app = self.new_app()
        # ROUTES GenerateRoutes: GET and HEAD /api/version
        self.app.get("/api/version")(self.version)
        self.app.head("/api/version")(self.version)
        self.app.get("/v1/models")(self.models)
        self.app.get("/api/ps")(self.ps)
        self.app.post("/api/show")(self.show)
        self.app.post("/api/chat")(self.chat)

    async def version(self) -> dict[str, str]:
        return {"version": "0.0.0"}  # version/version.go: Version, set at build

    async def models(self) -> dict[str, Any]:
        # OPENAI ToListCompletion: id the model, created its modification time, owned_by
        # the name's namespace
        card = {
            "id": self.model,
            "object": "model",
            "created": self.modified,
            "owned_by": namespace(self.model),
        }
        return {"object": "list", "data": [card]}

    async def ps(self) -> dict[str, Any]:
        # ROUTES PsHandler: the loaded models only (TYPES ProcessModelResponse)
        if not self.engine.loaded:
            return {"models": []}
        loaded = {
            "name": self.model,
            "model": self.model,
            "size": 270_000_000,
            "digest": "0" * 64,
            "details": {"format": "gguf", "family": "llama", "parameter_size": "135M"},
            "expires_at": "2099-01-01T00:00:00Z",
            "size_vram": 0,
            "context_length": self.context_length,
        }
        return {"models": [loaded]}

    async def show(self, request: Request) -> Response:
        # ROUTES ShowHandler: `parameters` as the Modelfile's PARAMETER lines
        body = await request.json()
        if body.get("model") != self.model:
            return JSONResponse({"error": f"model '{body.get('model')}' not found"}, 404)
        params = 'stop "<|im_end|>"'
        if self.num_ctx is not None:
            params = f"num_ctx {self.num_ctx}\n{params}"
        return JSONResponse({"parameters": params, "model_info": {"llama.context_length": 8192}})

    async def chat(self, request: Request) -> Response:
        start = time.monotonic()  # ROUTES ChatHandler: checkpointStart
        body = await request.json()
        self.bodies.append(body)
        # ROUTES scheduleRunner: the model is loaded on first use; then checkpointLoaded
        await asyncio.sleep(self.engine.load())
        loaded = time.monotonic()
        options = body.get("options") or {}
        run = self.engine.plan(body["messages"], int(options.get("num_predict") or 128))
        # ROUTES streamResponse: NDJSON, one object a line
        return StreamingResponse(
            self._stream(body, run, start, loaded), media_type="application/x-ndjson"
        )

    async def _stream(
        self, body: dict[str, Any], run: Run, start: float, loaded: float
    ) -> AsyncIterator[str]:
        model = body.get("model")
        prefill = self.engine.prefill_time(run)
        await asyncio.sleep(prefill)
        decode_start = time.monotonic()
        for i, piece in enumerate(run.answer):
            if i:
                await asyncio.sleep(self.engine.decode_s)
            # ROUTES handleNativeChat: each piece a ChatResponse, done false; TYPES
            # Metrics are omitempty, so a piece carries none of them
            line = {
                "model": model,
                "created_at": _now(),
                "message": {"role": "assistant", "content": piece},
                "done": False,
            }
            yield json.dumps(line) + "\n"
        decode = time.monotonic() - decode_start
        self.engine.remember(run)
        # the final message: LLAMA promptEvalCount (cache_n + prompt_n: the whole
        # prompt), prompt_ms and predicted_ms as durations; ROUTES: total_duration since
        # checkpointStart, load_duration checkpointLoaded - checkpointStart
        final: dict[str, Any] = {
            "model": model,
            "created_at": _now(),
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": run.finish,
            "total_duration": int((time.monotonic() - start) * 1e9),
            "load_duration": int((loaded - start) * 1e9),
            "prompt_eval_count": len(run.prompt),
            "prompt_eval_duration": int(prefill * 1e9),
            "eval_count": len(run.answer),
            "eval_duration": int(decode * 1e9),
        }
        final = {k: v for k, v in final.items() if v != 0 or k == "done"}  # omitempty
        self.sent.append(Sent(final, run.cached))
        yield json.dumps(final) + "\n"
