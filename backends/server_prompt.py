"""A prompt as llama-server reads it: `POST /apply-template` renders the messages with
the model's chat template, `POST /tokenize` (`with_pieces`) gives each token's text.

Only llama-server has both; every other server's prompt sections are estimated. A
piece that is not valid UTF-8 on its own (part of a character) comes as a list of byte
values. Anything unexpected in the replies means "cannot say" (None), never a guess.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import Message
from phasechat.backends.windows import fetch_json
from phasechat.backends.wire_numbers import NOT_JSON
from phasechat.backends.wire_text import as_text

#: One deadline for both calls: the prompt's sections are a nicety, never a wait.
TIMEOUT_S = 5.0
#: The largest reply read (a 32k-token prompt's pieces are well under this).
MAX_BYTES = 16 * 1024 * 1024


async def render_on_llama_server(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], messages: tuple[Message, ...]
) -> RenderedPrompt | None:
    """`messages` through llama-server's template and tokenizer (None: it cannot say)."""
    body = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
    rendered = await _post(client, f"{root}/apply-template", headers, body)
    said = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(said, str):
        return None
    text = as_text(said)  # a lone surrogate cannot be encoded, nor shown
    tokenized = await _post(
        client, f"{root}/tokenize", headers, {"content": text, "with_pieces": True}
    )
    tokens = tokenized.get("tokens") if isinstance(tokenized, dict) else None
    if not isinstance(tokens, list):
        return None
    pieces = []
    for token in tokens:
        piece = token.get("piece") if isinstance(token, dict) else None
        if isinstance(piece, str):
            pieces.append(as_text(piece).encode("utf-8"))
        elif isinstance(piece, list) and all(isinstance(b, int) and 0 <= b < 256 for b in piece):
            pieces.append(bytes(piece))
        else:
            return None
    return RenderedPrompt(text, tuple(pieces), "server")


async def _post(
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
