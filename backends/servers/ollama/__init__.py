"""Ollama: `owned_by` `library` or `ollama` in its OpenAI-compatible listing; the window
it runs with in `GET /api/ps` (a loaded model's `context_length`), else `num_ctx` in
`POST /api/show`'s `parameters` (the trained `<arch>.context_length` is not the window
in force). No /metrics, no per-request timings on the OpenAI stream; it cuts a prompt
to its window silently (telemetry/metrics.py says so when the counts show it)."""

from __future__ import annotations

import re

import httpx

from phasechat.backends.servers.family import ServerFamily, checked_window
from phasechat.backends.urls import endpoint
from phasechat.backends.windows import Window, fetch_json
from phasechat.backends.wire_numbers import Fields


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


FAMILY = ServerFamily(
    name="Ollama",
    owned_by=("library", "ollama"),
    own_window=running_window,
    docs="github.com/ollama/ollama docs/api.md, docs/openai.md",
)
