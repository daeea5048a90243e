"""llama-server's teacher forcing (its `ServerFamily.forcing`,
backends/remote/servers/forcing.py). Its API has no log-probabilities of prompt tokens, only
the top `n_probs` of the token it generates next (`/completion`'s
`completion_probabilities`). So each answer position is its own request: the tokens
before it as the prompt, `n_predict` 1, `cache_prompt` on, so the slot keeps the prefix
and reads one new token a request. What it cannot do: read the answer in one evaluation
(N positions are N round trips, each a batch of one token, numerically another path
than one prefill); give more than the top `n_probs`; keep its cache when other clients
share its slots (a request then reads the whole prefix again: slower, the same
numbers)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from phasechat.backends.base import Stopped
from phasechat.backends.events import Message
from phasechat.backends.remote.servers.forcing import (
    TOP_K,
    Forcing,
    Listed,
    Server,
    TeacherError,
    ask,
    check_span,
    checked,
    field,
    ids_of,
    token_id,
)
from phasechat.backends.remote.servers.llama_server.pieces import llama_piece
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.untrusted import as_text


async def llama_server_top(
    server: Server,
    tokens: Sequence[int],
    start: int,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
    k: int = TOP_K,
) -> list[Listed]:
    """The top-`k` log-probabilities predicting `tokens[start:]` on a llama-server, one
    request per position; `progress(done, total)` after each, a set `stop` raises
    `Stopped` before the next."""
    check_span(tokens, start)
    url = endpoint(server.root, "/completion")
    out = []
    total = len(tokens) - start
    for i in range(start, len(tokens)):
        if stop is not None and stop.is_set():
            raise Stopped
        body = {
            "prompt": list(tokens[:i]),
            "n_predict": 1,
            "n_probs": k,
            "cache_prompt": True,
            "temperature": 0,
        }
        answer = await ask(server, url, body)
        try:
            top = answer["completion_probabilities"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise TeacherError(
                "llama-server's answer has no completion_probabilities[0].top_logprobs"
            ) from None
        if not isinstance(top, list) or not top:
            raise TeacherError(f"llama-server listed no tokens at position {i}")
        listed = {token_id(field(t, "id")): field(t, "logprob") for t in top}
        out.append(checked(listed, i))
        if progress is not None:
            progress(i - start + 1, total)
    return out


async def llama_server_tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
    """`text`'s ids on llama-server, no special token added nor parsed (an answer that
    spells "<|im_end|>" is text), and each one's bytes."""
    body = {"content": text, "add_special": False, "parse_special": False, "with_pieces": True}
    said = await ask(server, endpoint(server.root, "/tokenize"), body)
    listed = said.get("tokens") if isinstance(said, dict) else None
    if not isinstance(listed, list):
        raise TeacherError("llama-server's /tokenize sent no tokens")
    ids, pieces = [], []
    for token in listed:
        piece = llama_piece(field(token, "piece"))
        if piece is None:
            raise TeacherError("llama-server's /tokenize sent a piece that is not text or bytes")
        ids.append(token_id(field(token, "id")))
        pieces.append(piece)
    if b"".join(pieces) != text.encode("utf-8"):
        raise TeacherError("llama-server's tokens do not spell the text they were made of")
    return ids, tuple(pieces)


async def llama_server_detokenize(server: Server, ids: Sequence[int]) -> str:
    said = await ask(server, endpoint(server.root, "/detokenize"), {"tokens": list(ids)})
    text = said.get("content") if isinstance(said, dict) else None
    if not isinstance(text, str):
        raise TeacherError("llama-server's /detokenize sent no text")
    return as_text(text)


async def llama_server_prompt(server: Server, messages: tuple[Message, ...]) -> list[int]:
    """The ids of `messages` as a chat request reads them: its template (/apply-template),
    then its tokenizer with special tokens parsed and added (as the server does)."""
    body = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
    said = await ask(server, endpoint(server.root, "/apply-template"), body)
    prompt = said.get("prompt") if isinstance(said, dict) else None
    if not isinstance(prompt, str):
        raise TeacherError("llama-server's /apply-template sent no prompt")
    read = {"content": prompt, "add_special": True, "parse_special": True}
    said = await ask(server, endpoint(server.root, "/tokenize"), read)
    tokens = said.get("tokens") if isinstance(said, dict) else None
    return ids_of(tokens, "llama-server's /tokenize")


LLAMA_SERVER_FORCING = Forcing(
    top=llama_server_top,
    tokenize=llama_server_tokenize,
    detokenize=llama_server_detokenize,
    prompt_tokens=llama_server_prompt,
    cannot=(
        "llama-server reads each answer token in a request of its own, as a batch of one "
        "(here: batches of 512; that alone moves the KL by a few thousandths on the "
        "bundled model, bench/README.md)"
    ),
)
