"""A remote server's context window: the record of one, and the reads its look-up makes.

Where each family keeps its window (a field of `GET /v1/models`, an endpoint of its own)
is the family's (backends/remote/servers/); `backends.servers.ask_window` asks in that order.
A server that says nothing (OpenAI, LM Studio, an unknown one) has an unknown window,
which the user can set (`--context`, `[[endpoints]] context`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from phasechat.backends.remote.wire_numbers import NOT_JSON, load_json


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
