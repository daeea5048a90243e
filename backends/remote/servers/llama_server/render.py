"""llama-server's rendering of a prompt (its `ServerFamily.render`): `POST
/apply-template` renders the messages with the model's chat template, `POST /tokenize`
(`with_pieces`) gives each token's text; a piece that is not valid UTF-8 on its own
(part of a character) comes as a list of byte values (`llama_piece`)."""

from __future__ import annotations

import httpx

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import Message
from phasechat.backends.remote.servers.llama_server.pieces import llama_piece
from phasechat.backends.remote.servers.rendering import reply_or_none
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.untrusted import as_text


async def render_on_llama_server(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], messages: tuple[Message, ...]
) -> RenderedPrompt | None:
    """`messages` through llama-server's template and tokenizer (None: it cannot say)."""
    body = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
    rendered = await reply_or_none(client, endpoint(root, "/apply-template"), headers, body)
    said = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(said, str):
        return None
    text = as_text(said)  # a lone surrogate cannot be encoded, nor shown
    tokenized = await reply_or_none(
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
