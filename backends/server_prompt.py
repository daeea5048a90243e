"""A prompt as llama-server reads it: `POST /apply-template` renders the messages with
the model's chat template, `POST /tokenize` (`with_pieces`) gives each token's text.

Only llama-server has both; every other server's prompt sections are estimated. A
piece that is not valid UTF-8 on its own (part of a character) comes as a list of byte
values. Anything unexpected in the replies means "cannot say" (None), never a guess.
"""

from __future__ import annotations

from typing import Any

import httpx

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import Message

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
    text = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(text, str):
        return None
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
            pieces.append(piece.encode("utf-8"))
        elif isinstance(piece, list) and all(isinstance(b, int) and 0 <= b < 256 for b in piece):
            pieces.append(bytes(piece))
        else:
            return None
    return RenderedPrompt(text, tuple(pieces), "server")


async def _post(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]
) -> Any:
    try:
        r = await client.post(url, json=body, headers=headers, timeout=TIMEOUT_S)
        if r.status_code != 200 or len(r.content) > MAX_BYTES:
            return None
        return r.json()
    except (httpx.HTTPError, ValueError, RecursionError):
        return None
