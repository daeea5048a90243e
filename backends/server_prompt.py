"""A prompt as the server reads it, rendered and tokenized by llama-server or vLLM itself.

llama-server: `POST /apply-template` renders the messages with the model's chat
template, `POST /tokenize` (`with_pieces`) gives each token's text; a piece that is not
valid UTF-8 on its own (part of a character) comes as a list of byte values.

vLLM: `POST /tokenize` with the messages (`add_generation_prompt`, as a chat request
renders them) gives the prompt's token ids and, with `return_token_strs`, each token's
vocabulary string (backends/token_text.py reads them as bytes); `POST /detokenize` of
the same ids gives the server's own text of them, which the bytes must spell exactly
(vllm/entrypoints/serve/tokenize/protocol.py, TokenizeChatRequest, vLLM 0.32).

Every other server's prompt sections are estimated. Anything unexpected in the replies
means "cannot say" (None), never a guess.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import Message
from phasechat.backends.token_text import llama_piece, pieces_of
from phasechat.backends.urls import endpoint
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
    rendered = await _post(client, endpoint(root, "/apply-template"), headers, body)
    said = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(said, str):
        return None
    text = as_text(said)  # a lone surrogate cannot be encoded, nor shown
    tokenized = await _post(
        client, endpoint(root, "/tokenize"), headers, {"content": text, "with_pieces": True}
    )
    tokens = tokenized.get("tokens") if isinstance(tokenized, dict) else None
    if not isinstance(tokens, list):
        return None
    pieces = []
    for token in tokens:
        piece = llama_piece(token.get("piece") if isinstance(token, dict) else None)
        if piece is None:
            return None
        pieces.append(piece)
    return RenderedPrompt(text, tuple(pieces), "server")


async def render_on_vllm(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], messages: tuple[Message, ...]
) -> RenderedPrompt | None:
    """`messages` through vLLM's template and tokenizer (None: it cannot say)."""
    body = {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "add_generation_prompt": True,
        "return_token_strs": True,
    }
    tokenized = await _post(client, endpoint(root, "/tokenize"), headers, body)
    if not isinstance(tokenized, dict):
        return None
    ids, strs = tokenized.get("tokens"), tokenized.get("token_strs")
    if not (isinstance(ids, list) and isinstance(strs, list) and len(ids) == len(strs)):
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return None
    if not all(isinstance(s, str) for s in strs):
        return None
    said = await _post(client, endpoint(root, "/detokenize"), headers, {"tokens": ids})
    text = said.get("prompt") if isinstance(said, dict) else None
    if not isinstance(text, str):
        return None
    text = as_text(text)  # a lone surrogate cannot be encoded, nor shown
    pieces = pieces_of([as_text(s) for s in strs], text)
    return RenderedPrompt(text, pieces, "server") if pieces is not None else None


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
