"""A prompt as the server reads it, rendered and tokenized by the server itself: what
each family's `render` (its `ServerFamily.render`) shares. llama-server's is in
servers/llama_server/render.py (`/apply-template`, `/tokenize`), vLLM's in
servers/vllm/render.py (`/tokenize`, `/detokenize`).

Every other server's prompt sections are estimated. Anything unexpected in the replies
means "cannot say" (None), never a guess: `reply_or_none` gives None for an error status, a body
too large, not JSON, or one not all there within the deadline.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from phasechat.backends.remote.windows import fetch_json
from phasechat.backends.remote.wire_numbers import NOT_JSON

#: One deadline for both calls: the prompt's sections are a nicety, never a wait.
TIMEOUT_S = 5.0
#: The largest reply read (a 32k-token prompt's pieces are well under this).
MAX_BYTES = 16 * 1024 * 1024


async def reply_or_none(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]
) -> object:
    """The JSON reply of `url`, or None: an error status, a body over MAX_BYTES, not JSON,
    or not all there within TIMEOUT_S (a server that drips it)."""
    try:
        async with asyncio.timeout(TIMEOUT_S):
            said = await fetch_json(client, "POST", url, headers, body, MAX_BYTES)
    except (httpx.HTTPError, TimeoutError):
        return None
    return None if said is NOT_JSON else said
