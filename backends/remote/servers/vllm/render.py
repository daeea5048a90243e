"""vLLM's rendering of a prompt (its `ServerFamily.render`): `POST /tokenize` with the
messages (`add_generation_prompt`, as a chat request renders them) gives the prompt's
token ids and, with `return_token_strs`, each token's vocabulary string
(backends/remote/token_text.py reads them as bytes); `POST /detokenize` of the same ids gives
the server's own text of them, which the bytes must spell exactly
(vllm/entrypoints/serve/tokenize/protocol.py, TokenizeChatRequest, vLLM 0.32)."""

from __future__ import annotations

import httpx

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import Message
from phasechat.backends.remote.servers.rendering import reply_or_none
from phasechat.backends.remote.token_text import pieces_of
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.untrusted import as_text


async def render_on_vllm(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], messages: tuple[Message, ...]
) -> RenderedPrompt | None:
    """`messages` through vLLM's template and tokenizer (None: it cannot say)."""
    body = {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "add_generation_prompt": True,
        "return_token_strs": True,
    }
    tokenized = await reply_or_none(client, endpoint(root, "/tokenize"), headers, body)
    if not isinstance(tokenized, dict):
        return None
    ids, strs = tokenized.get("tokens"), tokenized.get("token_strs")
    if not (isinstance(ids, list) and isinstance(strs, list) and len(ids) == len(strs)):
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return None
    if not all(isinstance(s, str) for s in strs):
        return None
    said = await reply_or_none(client, endpoint(root, "/detokenize"), headers, {"tokens": ids})
    text = said.get("prompt") if isinstance(said, dict) else None
    if not isinstance(text, str):
        return None
    text = as_text(text)  # a lone surrogate cannot be encoded, nor shown
    pieces = pieces_of([as_text(s) for s in strs], text)
    return RenderedPrompt(text, pieces, "server") if pieces is not None else None
