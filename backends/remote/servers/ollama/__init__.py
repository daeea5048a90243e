"""Ollama (ollama/ollama), read against its source (tests/standins/ollama.py pins the
commit). Its OpenAI-compatible listing names each model's namespace as its owner
(openai/openai.go `ToListCompletion`: "library" by default, the user's name for
`user/model`), so it is recognised by `GET /api/version`, which only Ollama answers
(server/routes.go: `{"version": ...}`). The window it runs with is in `GET /api/ps` (a
loaded model's `context_length`), else `num_ctx` in `POST /api/show`'s `parameters` (the
trained `<arch>.context_length` is not the window in force).

Its own account of an answer (api/types.go `Metrics`: `load_duration`,
`prompt_eval_count`, `prompt_eval_duration`, `eval_count`, `eval_duration`, in
nanoseconds; what `ollama run --verbose` prints) is on the final message of its native
`/api/chat` stream only: the OpenAI-compatible stream turns it into usage counts
(openai.go `ToUsage`) and drops the times. So phasechat talks to Ollama on `/api/chat`
(`ServerFamily.native`): one request, the answer and its account together, the model's
load apart from the prompt's evaluation. Ollama has no /metrics and says nothing of a
cached prefix (its `prompt_eval_count` is the whole prompt, cached or not); it cuts a
prompt to its window silently (telemetry/metrics.py says so when the counts show it)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from phasechat.backends.events import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    ReasoningDelta,
    ServerAccount,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.backends.remote.servers.family import NativeChat, ServerFamily, checked_window
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.remote.windows import Window, fetch_json
from phasechat.backends.remote.wire_numbers import NOT_JSON, Fields, as_ms, load_json
from phasechat.backends.untrusted import as_text

_DONE: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


async def running_window(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], model: str, f: Fields | None
) -> Window | None:
    """Ollama's running window: `/api/ps` for a loaded model, else `num_ctx` from
    `/api/show` (the trained context is not the window Ollama runs with)."""
    listing = await fetch_json(client, "GET", endpoint(root, "/api/ps"), headers)
    running = listing.get("models") if isinstance(listing, dict) else None
    for m in running if isinstance(running, list) else []:
        mine = isinstance(m, dict) and model in (m.get("name"), m.get("model"))
        if mine and (n := checked_window(m.get("context_length"), "/api/ps context_length", f)):
            return Window(n, "Ollama /api/ps context_length")
    body = await fetch_json(client, "POST", endpoint(root, "/api/show"), headers, {"model": model})
    params = body.get("parameters") if isinstance(body, dict) else None
    found = re.search(r"^num_ctx\s+(\d+)", params, re.M) if isinstance(params, str) else None
    if found is None:
        return None
    digits = found.group(1)
    # Python refuses int() of more than 4,300 digits; no window has more than 8.
    said: object = int(digits) if len(digits) <= 12 else f"{len(digits)} digits"
    if n := checked_window(said, "/api/show num_ctx", f):
        return Window(n, "Ollama /api/show num_ctx")
    return None


async def identify(client: httpx.AsyncClient, root: str, headers: dict[str, str]) -> bool:
    """Is it Ollama (`GET /api/version` answers `{"version": "..."}` and nothing else)?"""
    said = await fetch_json(client, "GET", endpoint(root, "/api/version"), headers, limit=4096)
    return isinstance(said, dict) and set(said) == {"version"} and isinstance(said["version"], str)


def chat_body(request: GenerationRequest, model: str) -> dict[str, Any]:
    """api/types.go `ChatRequest`: the messages, streamed, the sampling in `options`."""
    options: dict[str, Any] = {
        "num_predict": request.max_tokens,
        "temperature": request.temperature,
    }
    if request.seed is not None:
        options["seed"] = request.seed
    if request.stop:
        options["stop"] = list(request.stop)
    return {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "stream": True,
        "options": options,
    }


def _ns(obj: dict[str, Any], key: str, f: Fields, absent: float | None) -> float | None:
    """A duration in nanoseconds as ms (`absent` when the key is not there: Go's
    `omitempty` drops a zero)."""
    if key not in obj:
        return absent
    value = obj[key]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ms = as_ms(value / 1e6) if number else None
    if ms is None:
        f.ignore(key, value)
    return ms


def chat_line(data: str, f: Fields) -> list[Event]:
    """The events of one line of `/api/chat`'s stream: a piece of the answer (and of its
    thinking), and on the final one (`done`) its end, usage and Ollama's own account."""
    obj = load_json(data)
    if obj is NOT_JSON or not isinstance(obj, dict):
        return [StreamError("protocol", f"malformed line from server: {data[:80]!r}")]
    if "error" in obj:
        return [StreamError("server", f"server error: {as_text(str(obj['error']))[:500]}", True)]
    out: list[Event] = []
    message = obj.get("message")
    message = message if isinstance(message, dict) else {}
    thinking, content = message.get("thinking"), message.get("content")
    if isinstance(thinking, str) and thinking:
        out.append(ReasoningDelta(as_text(thinking)))
    if isinstance(content, str) and content:
        out.append(TextDelta(as_text(content)))
    if obj.get("done") is not True:
        return out
    prompt = f.count(obj, "prompt_eval_count", "")
    generated = f.count(obj, "eval_count", "")
    out.append(Usage(prompt, generated))
    out.append(
        ServerAccount(
            "Ollama /api/chat",
            prompt_tokens=prompt,
            generated_tokens=generated,
            load_ms=_ns(obj, "load_duration", f, 0.0),
            prefill_ms=_ns(obj, "prompt_eval_duration", f, None),
            decode_ms=_ns(obj, "eval_duration", f, None),
        )
    )
    out.append(Finished(_DONE.get(str(obj.get("done_reason")), "other")))
    return out


FAMILY = ServerFamily(
    name="Ollama",
    identify=identify,
    own_window=running_window,
    native=NativeChat("/api/chat", chat_body, chat_line),
    docs="ollama/ollama: api/types.go (Metrics), server/routes.go, openai/openai.go",
)
