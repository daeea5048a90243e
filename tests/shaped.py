"""Servers shaped like vLLM and Ollama, for what phasechat cannot get from a real one here:
a hidden prefix cache, a silently truncating window, speculative-decoding fields.

Served through an `httpx.MockTransport` into the real `RemoteBackend`, so the whole
client path (requests, SSE parsing, the window probes) runs. The shapes:
- vLLM `/v1/models` entries carry `max_model_len` (vllm/entrypoints/openai/protocol.py,
  `ModelCard`); its streamed `usage` has `prompt_tokens_details: null` unless the server
  runs with `--enable-prompt-tokens-details`.
- Ollama answers `GET /api/version`, lists models with `owned_by: "library"`, streams
  its answers on `/api/chat` as JSON lines; `GET /api/ps` reports the loaded
  model's `context_length`; `POST /api/show` has `parameters` (`num_ctx N`) and
  `model_info` (`<arch>.context_length`, the trained context); a prompt longer than
  `num_ctx` is cut to fit and usage reports what was kept.
- llama-server with a draft model adds `draft_n` / `draft_n_accepted` to `timings`
  (tools/server/server-common.cpp, `server_slot_stats::to_json`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig


def sse(*objs: dict[str, Any]) -> bytes:
    body = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)
    return body + b"data: [DONE]\n\n"


def chunk(text: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def answer(words: int, usage: dict[str, Any], **last: Any) -> bytes:
    """`words` chunks of text, a finish, then a usage chunk (stream_options.include_usage)."""
    chunks = [chunk(f"w{i} ") for i in range(words)]
    return sse(*chunks, chunk(finish="stop", **last), {"choices": [], "usage": usage})


class Shaped:
    """A scripted server: `models` for `/v1/models`, `routes` for other GETs/POSTs, and
    `reply(request_json)` for each chat completion. Records every request."""

    def __init__(
        self,
        models: list[dict[str, Any]],
        reply: Callable[[dict[str, Any]], bytes | httpx.Response],
        routes: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.models, self.reply, self.routes = models, reply, routes or {}
        self.requests: list[httpx.Request] = []
        #: answer the next chat request with this HTTP status (once), as a server's 400
        self.fail_next = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path.endswith("/v1/models"):
            return httpx.Response(200, json={"object": "list", "data": self.models})
        if path.endswith(("/chat/completions", "/api/chat")):
            if self.fail_next:
                status, self.fail_next = self.fail_next, 0
                error = {"message": "invalid request", "type": "invalid_request_error"}
                return httpx.Response(status, json={"error": error})
            body = self.reply(json.loads(request.content))
            if isinstance(body, httpx.Response):
                return body

            async def stream() -> AsyncIterator[bytes]:
                yield body

            ctype = "application/x-ndjson" if path.endswith("/api/chat") else "text/event-stream"
            return httpx.Response(200, content=stream(), headers={"content-type": ctype})
        if path in self.routes:
            return httpx.Response(200, json=self.routes[path])
        return httpx.Response(404, json={"error": "not found"})

    def backend(self, **config: Any) -> RemoteBackend:
        cfg = RemoteConfig(base_url="http://shaped.test/v1", **config)
        return RemoteBackend(cfg, httpx.MockTransport(self.handle))


VLLM_MODELS = [
    {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm", "max_model_len": 32768}
]
OLLAMA_MODELS = [{"id": "llama3.2:1b", "object": "model", "created": 0, "owned_by": "library"}]


def too_long(n_prompt: int, n_ctx: int) -> httpx.Response:
    """llama-server's refusal of a prompt longer than its slot (HTTP 400; the fields from
    tools/server/server-task.cpp, server_task_result_error::to_json)."""
    message = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
        "try increasing it"
    )
    error = {"code": 400, "message": message, "type": "exceed_context_size_error",
             "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}  # fmt: skip
    return httpx.Response(400, json={"error": error})


def ollama_routes(num_ctx: int, loaded: bool) -> dict[str, dict[str, Any]]:
    ps = {"models": [{"name": "llama3.2:1b", "model": "llama3.2:1b", "context_length": num_ctx}]}
    show = {
        "parameters": f'num_ctx {num_ctx}\nstop "<|eot_id|>"',
        "model_info": {"llama.context_length": 131072},
    }
    return {
        "/api/ps": ps if loaded else {"models": []},
        "/api/show": show,
        "/api/version": {"version": "0.0.0"},  # what only Ollama answers
    }


def ollama_answer(words: int, prompt_eval_count: int) -> bytes:
    """An answer on Ollama's own `/api/chat` (NDJSON): `words` pieces, then the final
    message with its counts (server/routes.go handleNativeChat; api/types.go Metrics)."""
    lines = [
        {"message": {"role": "assistant", "content": f"w{i} "}, "done": False} for i in range(words)
    ]
    final = {
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": prompt_eval_count,
        "eval_count": words,
    }
    return "".join(json.dumps(x) + "\n" for x in [*lines, final]).encode()
