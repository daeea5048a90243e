"""A remote server's context window, asked of the server itself where it says it.

- llama.cpp's llama-server: `GET /v1/models` carries `meta.n_ctx` (the slot's window,
  tools/server/server-context.cpp, the models listing), and `GET /props` carries
  `default_generation_settings.n_ctx` and `total_slots`.
- vLLM: `GET /v1/models` carries `max_model_len` per model.
- Ollama: `POST /api/show` has the model's trained `<arch>.context_length` and, when the
  Modelfile sets it, `num_ctx` in `parameters`; `GET /api/ps` has the `context_length` a
  loaded model runs with. The window in force is the running one, not the trained one.

Anything else (OpenAI, LM Studio, an unknown server) says nothing: the window is unknown
and the user can set it (`--context`, `[[endpoints]] context`).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import httpx

from phasechat.backends.wire_numbers import NOT_JSON, Fields, as_count, load_json

#: `owned_by` in Ollama's OpenAI-compatible `/v1/models` listing
OLLAMA_OWNERS = ("library", "ollama")


@dataclass(frozen=True, slots=True)
class Window:
    """A context window in tokens, and which endpoint said so."""

    tokens: int
    source: str
    slots: int | None = None  # llama-server's parallel slots, each with this window
    #: llama-server's /props says it serves /metrics (`endpoint_metrics`: `--metrics`)
    metrics: bool = False


#: The whole window look-up (every request it makes) ends within this many seconds: a
#: server that drips its metadata a byte at a time leaves the window unknown, no more.
DEADLINE_S = 4.0
#: The largest metadata body read (a llama-server /props is a few KB; Ollama's /api/show
#: carries the chat template and license, tens of KB).
MAX_BODY = 1024 * 1024


def _positive(value: object) -> int | None:
    n = as_count(value)
    return n if n else None


def _window(value: object, name: str, f: Fields | None) -> int | None:
    """A window from field `name`: a positive count of at most MAX_TOKENS, else None
    (noted in `f` when the server said something unbelievable)."""
    n = _positive(value)
    if n is None and value is not None and f is not None:
        f.ignore(name, value)
    return n


async def ask_window(
    client: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    entries: list[dict[str, Any]],
    model: str,
    f: Fields | None = None,
) -> Window | None:
    """The window of `model` where the server says it, from its `/v1/models` `entries`
    and, by what they say the server is, its own endpoints; None when it does not say,
    says nonsense (noted in `f`) or takes longer than DEADLINE_S to say it."""
    root = root_of(base_url)
    try:
        async with asyncio.timeout(DEADLINE_S):
            if any(m.get("owned_by") == "llamacpp" for m in entries):
                props = await llama_server_props(client, root, headers, f)
                return props or from_models(entries, model, f)
            listed = from_models(entries, model, f)
            ollama = any(m.get("owned_by") in OLLAMA_OWNERS for m in entries)
            if listed is not None or not ollama:
                return listed
            return await ollama_window(client, root, headers, model, f)
    except (TimeoutError, httpx.HTTPError):
        return None


def from_models(
    entries: list[dict[str, Any]], model: str, f: Fields | None = None
) -> Window | None:
    """The window the `/v1/models` listing gives for `model` (llama-server, vLLM)."""
    entry = next((e for e in entries if e.get("id") == model), entries[0] if entries else {})
    meta = entry.get("meta")
    if isinstance(meta, dict) and (n := _window(meta.get("n_ctx"), "meta.n_ctx", f)):
        return Window(n, "llama-server /v1/models meta.n_ctx")
    if n := _window(entry.get("max_model_len"), "max_model_len", f):
        return Window(n, "vLLM /v1/models max_model_len")
    return None


def root_of(base_url: str) -> str:
    """The server's root for its own endpoints: the base URL without a final /v1."""
    return re.sub(r"/v1/?$", "", base_url.rstrip("/"))


async def fetch_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any] | None = None,
    limit: int = MAX_BODY,
) -> object:
    """The JSON of a 200 answer of at most `limit` bytes, else `NOT_JSON`. The caller
    bounds the time (`asyncio.timeout`); each read also gives up after DEADLINE_S."""
    async with client.stream(method, url, headers=headers, json=body, timeout=DEADLINE_S) as r:
        data = await read_body(r, limit) if r.status_code == 200 else None
    return load_json(data) if data is not None else NOT_JSON


async def read_body(response: httpx.Response, limit: int = MAX_BODY) -> bytes | None:
    """The body of a streamed `response`, or None when it is longer than `limit`."""
    data = bytearray()
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) > limit:
            return None
    return bytes(data)


async def llama_server_props(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], f: Fields | None = None
) -> Window | None:
    """llama-server's `GET /props`: the slot window and how many slots share the server."""
    body = await fetch_json(client, "GET", f"{root}/props", headers)
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    said = settings.get("n_ctx") if isinstance(settings, dict) else None
    n = _window(said, "/props n_ctx", f)
    if n is None or not isinstance(body, dict):
        return None
    slots = as_count(body.get("total_slots"), limit=4096)
    return Window(n, "llama-server /props", slots or None, body.get("endpoint_metrics") is True)


async def ollama_window(
    client: httpx.AsyncClient,
    root: str,
    headers: dict[str, str],
    model: str,
    f: Fields | None = None,
) -> Window | None:
    """Ollama's running window: `/api/ps` for a loaded model, else `num_ctx` from
    `/api/show` (the trained context is not the window Ollama runs with)."""
    listing = await fetch_json(client, "GET", f"{root}/api/ps", headers)
    running = listing.get("models") if isinstance(listing, dict) else None
    for m in running if isinstance(running, list) else []:
        mine = isinstance(m, dict) and model in (m.get("name"), m.get("model"))
        if mine and (n := _window(m.get("context_length"), "/api/ps context_length", f)):
            return Window(n, "Ollama /api/ps context_length")
    body = await fetch_json(client, "POST", f"{root}/api/show", headers, {"model": model})
    params = body.get("parameters") if isinstance(body, dict) else None
    found = re.search(r"^num_ctx\s+(\d+)", params, re.M) if isinstance(params, str) else None
    if found is None:
        return None
    digits = found.group(1)
    # Python refuses int() of more than 4,300 digits; no window has more than 8.
    said: object = int(digits) if len(digits) <= 12 else f"{len(digits)} digits"
    if n := _window(said, "/api/show num_ctx", f):
        return Window(n, "Ollama /api/show num_ctx")
    return None


#: How servers say a prompt does not fit, and where they put the numbers.
# vLLM before 0.10: "However, you requested 2100 tokens (...)"; 0.32: "However, your
# prompt contains at least 2049 input tokens" (tests/fixtures/vllm/04-too-long.json)
_VLLM_LIMIT = re.compile(
    r"maximum context length is (\d{1,12}) tokens.*?\b(\d{1,12}) (?:input )?tokens", re.S
)
_LLAMA_LIMIT = re.compile(
    r"request \((\d{1,12}) tokens\) exceeds the available context size \((\d{1,12})\b"
)


def _sizes(n_ctx: str, n_prompt: str) -> dict[str, object]:
    """The sizes a refusal's text gives, each kept only when believable."""
    sizes = {"n_ctx": _positive(int(n_ctx)), "n_prompt_tokens": _positive(int(n_prompt))}
    return {k: v for k, v in sizes.items() if v is not None}


def context_refusal(body: str) -> dict[str, object] | None:
    """If an error body says the prompt does not fit the server's window: what it says
    of the sizes (`n_ctx`, `n_prompt_tokens`, either may be missing); else None.

    llama-server: `type: exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`
    (tools/server/server-task.cpp, server_task_result_error::to_json); vLLM and OpenAI:
    "This model's maximum context length is N tokens. However, you requested M tokens",
    or OpenAI's `code: context_length_exceeded`."""
    obj = load_json(body)
    err = obj.get("error") if isinstance(obj, dict) else None
    err = err if isinstance(err, dict) else {}
    text = str(err.get("message") or body)
    out: dict[str, object] = {}
    if err.get("type") == "exceed_context_size_error" or _LLAMA_LIMIT.search(text):
        for key in ("n_ctx", "n_prompt_tokens"):
            if n := _positive(err.get(key)):
                out[key] = n
        if (m := _LLAMA_LIMIT.search(text)) and "n_ctx" not in out:
            out.update(_sizes(m.group(2), m.group(1)))
        return out
    if m := _VLLM_LIMIT.search(text):
        return _sizes(m.group(1), m.group(2))
    if err.get("code") == "context_length_exceeded":
        return out
    return None
