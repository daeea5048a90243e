"""llama.cpp's llama-server: `owned_by: llamacpp`; its slot's window in `GET /props`
(`default_generation_settings.n_ctx`, `total_slots`, and `endpoint_metrics` when it
serves /metrics) or `meta.n_ctx` in the listing; `exceed_context_size_error` refusals;
`llamacpp:` counters with `--metrics`; `return_progress` for prefill progress. Its
per-request `timings` and its `prompt_progress`: timings.py beside this (the local
engine reports the same shape)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from phasechat.backends.remote.servers.family import (
    PromNames,
    ServerFamily,
    checked_window,
    positive,
    sizes,
)
from phasechat.backends.remote.servers.llama_server import timings
from phasechat.backends.remote.servers.llama_server.render import render_on_llama_server
from phasechat.backends.remote.servers.llama_server.teacher import LLAMA_SERVER_FORCING
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.remote.windows import Window, fetch_json
from phasechat.backends.remote.wire_numbers import Fields, as_count

_LIMIT = re.compile(
    r"request \((\d{1,12}) tokens\) exceeds the available context size \((\d{1,12})\b"
)


def listed_window(entry: dict[str, Any], f: Fields | None) -> Window | None:
    """`meta.n_ctx` of a `/v1/models` entry (tools/server/server-context.cpp)."""
    meta = entry.get("meta")
    if isinstance(meta, dict) and (n := checked_window(meta.get("n_ctx"), "meta.n_ctx", f)):
        return Window(n, "llama-server /v1/models meta.n_ctx")
    return None


async def props_window(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], model: str, f: Fields | None
) -> Window | None:
    """llama-server's `GET /props`: the slot window and how many slots share the server."""
    body = await fetch_json(client, "GET", endpoint(root, "/props"), headers)
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    said = settings.get("n_ctx") if isinstance(settings, dict) else None
    n = checked_window(said, "/props n_ctx", f)
    if n is None or not isinstance(body, dict):
        return None
    slots = as_count(body.get("total_slots"), limit=4096)
    return Window(n, "llama-server /props", slots or None, body.get("endpoint_metrics") is True)


def refusal(err: dict[str, Any], text: str) -> dict[str, object] | None:
    """`type: exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`
    (tools/server/server-task.cpp, server_task_result_error::to_json), or its text."""
    found = _LIMIT.search(text)
    if err.get("type") != "exceed_context_size_error" and not found:
        return None
    out: dict[str, object] = {}
    for key in ("n_ctx", "n_prompt_tokens"):
        if n := positive(err.get(key)):
            out[key] = n
    if found and "n_ctx" not in out:
        out.update(sizes(found.group(2), found.group(1)))
    return out


FAMILY = ServerFamily(
    name="llama-server",
    owned_by=("llamacpp",),
    listed_window=listed_window,
    own_window=props_window,
    own_window_first=True,
    refusal=refusal,
    metrics=PromNames(
        engine="llama-server",
        prefix="llamacpp:",
        names={
            "running": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
            "prompt": ("llamacpp:prompt_tokens_total",),  # evaluated: cached ones apart
            "cached": ("llamacpp:prompt_tokens_cached_total",),
            "generated": ("llamacpp:tokens_predicted_total",),
            "prefill_s": ("llamacpp:prompt_seconds_total",),
            "decode_s": ("llamacpp:tokens_predicted_seconds_total",),
        },
        prompt_excludes_cached=True,
        probe="if_said",
    ),
    # llama-server only; OpenAI rejects unknown fields
    request_extras={"return_progress": True},
    cache_grain=1,  # any common prefix of the slot's tokens
    progress=timings.progress,
    timings=timings.timings,
    timings_source=timings.source,
    said_by=timings.SAID_BY,
    render=render_on_llama_server,
    forcing=LLAMA_SERVER_FORCING,  # n_probs: teacher.py beside this
    docs="llama.cpp tools/server/README.md",
)
