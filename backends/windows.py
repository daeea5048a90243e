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

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

#: `owned_by` in Ollama's OpenAI-compatible `/v1/models` listing
OLLAMA_OWNERS = ("library", "ollama")


@dataclass(frozen=True, slots=True)
class Window:
    """A context window in tokens, and which endpoint said so."""

    tokens: int
    source: str
    slots: int | None = None  # llama-server's parallel slots, each with this window


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


async def ask_window(
    client: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    entries: list[dict[str, Any]],
    model: str,
) -> Window | None:
    """The window of `model` where the server says it, from its `/v1/models` `entries`
    and, by what they say the server is, its own endpoints."""
    root = root_of(base_url)
    if any(m.get("owned_by") == "llamacpp" for m in entries):
        props = await llama_server_props(client, root, headers)
        return props or from_models(entries, model)
    listed = from_models(entries, model)
    if listed is not None or not any(m.get("owned_by") in OLLAMA_OWNERS for m in entries):
        return listed
    return await ollama_window(client, root, headers, model)


def from_models(entries: list[dict[str, Any]], model: str) -> Window | None:
    """The window the `/v1/models` listing gives for `model` (llama-server, vLLM)."""
    entry = next((e for e in entries if e.get("id") == model), entries[0] if entries else {})
    meta = entry.get("meta")
    if isinstance(meta, dict) and (n := _positive(meta.get("n_ctx"))):
        return Window(n, "llama-server /v1/models meta.n_ctx")
    if n := _positive(entry.get("max_model_len")):
        return Window(n, "vLLM /v1/models max_model_len")
    return None


def root_of(base_url: str) -> str:
    """The server's root for its own endpoints: the base URL without a final /v1."""
    return re.sub(r"/v1/?$", "", base_url.rstrip("/"))


async def llama_server_props(
    client: httpx.AsyncClient, root: str, headers: dict[str, str]
) -> Window | None:
    """llama-server's `GET /props`: the slot window and how many slots share the server."""
    try:
        r = await client.get(f"{root}/props", headers=headers, timeout=5.0)
        body = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    n = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if n is None:
        return None
    return Window(n, "llama-server /props", _positive(body.get("total_slots")))


async def ollama_window(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], model: str
) -> Window | None:
    """Ollama's running window: `/api/ps` for a loaded model, else `num_ctx` from
    `/api/show` (the trained context is not the window Ollama runs with)."""
    try:
        r = await client.get(f"{root}/api/ps", headers=headers, timeout=5.0)
        running = r.json().get("models", []) if r.status_code == 200 else []
        for m in running if isinstance(running, list) else []:
            mine = isinstance(m, dict) and model in (m.get("name"), m.get("model"))
            if mine and (n := _positive(m.get("context_length"))):
                return Window(n, "Ollama /api/ps context_length")
        r = await client.post(f"{root}/api/show", json={"model": model}, headers=headers)
        body = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    params = body.get("parameters") if isinstance(body, dict) else None
    found = re.search(r"^num_ctx\s+(\d+)", params, re.M) if isinstance(params, str) else None
    if found and (n := _positive(int(found.group(1)))):
        return Window(n, "Ollama /api/show num_ctx")
    return None


#: How servers say a prompt does not fit, and where they put the numbers.
_VLLM_LIMIT = re.compile(r"maximum context length is (\d+) tokens.*?(\d+) tokens", re.S)
_LLAMA_LIMIT = re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+)")


def context_refusal(body: str) -> dict[str, object] | None:
    """If an error body says the prompt does not fit the server's window: what it says
    of the sizes (`n_ctx`, `n_prompt_tokens`, either may be missing); else None.

    llama-server: `type: exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`
    (tools/server/server-task.cpp, server_task_result_error::to_json); vLLM and OpenAI:
    "This model's maximum context length is N tokens. However, you requested M tokens",
    or OpenAI's `code: context_length_exceeded`."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    err = obj.get("error") if isinstance(obj, dict) else None
    err = err if isinstance(err, dict) else {}
    text = str(err.get("message") or body)
    out: dict[str, object] = {}
    if err.get("type") == "exceed_context_size_error" or _LLAMA_LIMIT.search(text):
        for key in ("n_ctx", "n_prompt_tokens"):
            if n := _positive(err.get(key)):
                out[key] = n
        if (m := _LLAMA_LIMIT.search(text)) and "n_ctx" not in out:
            out.update(n_prompt_tokens=int(m.group(1)), n_ctx=int(m.group(2)))
        return out
    if m := _VLLM_LIMIT.search(text):
        return {"n_ctx": int(m.group(1)), "n_prompt_tokens": int(m.group(2))}
    if err.get("code") == "context_length_exceeded":
        return out
    return None
