"""vLLM's teacher forcing (its `ServerFamily.forcing`, backends/remote/servers/forcing.py): one
request, `/v1/completions` with the sequence as token ids and `prompt_logprobs=k`: every
prompt position's top k (at most the server's `--max-logprobs`, 20 by default) plus the
token that is there. The whole sequence is read in one prefill, as the local teacher
reads it (backends/local/teacher.py). Its tokens: `/tokenize` with `return_token_strs`, read
as bytes by backends/remote/token_text.py and held against the text they were made of."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

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
from phasechat.backends.remote.token_text import pieces_of
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.untrusted import as_text


async def vllm_top(
    server: Server,
    tokens: Sequence[int],
    start: int,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
    k: int = TOP_K,
) -> list[Listed]:
    """The top-`k` log-probabilities predicting `tokens[start:]` on a vLLM, one request
    (`progress` once, when it is read; `stop` cannot cut one request short)."""
    check_span(tokens, start)
    body = {
        "model": server.model,
        "prompt": list(tokens),
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": k,
    }
    answer = await ask(server, endpoint(server.v1, "/completions"), body)
    try:
        positions = answer["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise TeacherError("vLLM's answer has no choices[0].prompt_logprobs") from None
    if not isinstance(positions, list) or len(positions) != len(tokens):
        raise TeacherError(f"vLLM sent prompt_logprobs for other than the {len(tokens)} tokens")
    out = []
    for i in range(start, len(tokens)):
        entry = positions[i]
        if not isinstance(entry, dict):
            raise TeacherError(f"vLLM's prompt_logprobs[{i}] is not an object")
        out.append(checked({token_id(key): field(v, "logprob") for key, v in entry.items()}, i))
    if progress is not None:
        progress(len(out), len(out))
    return out


async def vllm_tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
    """`text`'s ids on vLLM, no special tokens added, and each one's bytes."""
    body = {
        "model": server.model,
        "prompt": text,
        "add_special_tokens": False,
        "return_token_strs": True,
    }
    said = await ask(server, endpoint(server.root, "/tokenize"), body)
    ids = ids_of(said.get("tokens") if isinstance(said, dict) else None, "vLLM's /tokenize")
    strs = said.get("token_strs")
    if (
        not isinstance(strs, list)
        or len(strs) != len(ids)
        or not all(isinstance(x, str) for x in strs)
    ):
        raise TeacherError("vLLM's /tokenize sent no token_strs for its tokens")
    pieces = pieces_of([as_text(x) for x in strs], text)
    if pieces is None:
        raise TeacherError("vLLM's tokens do not spell the text they were made of")
    return ids, pieces


async def vllm_detokenize(server: Server, ids: Sequence[int]) -> str:
    said = await ask(
        server, endpoint(server.root, "/detokenize"), {"model": server.model, "tokens": list(ids)}
    )
    text = said.get("prompt") if isinstance(said, dict) else None
    if not isinstance(text, str):
        raise TeacherError("vLLM's /detokenize sent no text")
    return as_text(text)


async def vllm_prompt(server: Server, messages: tuple[Message, ...]) -> list[int]:
    """The ids of `messages` as a chat request renders them (`add_generation_prompt`)."""
    body = {
        "model": server.model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "add_generation_prompt": True,
    }
    said = await ask(server, endpoint(server.root, "/tokenize"), body)
    return ids_of(said.get("tokens") if isinstance(said, dict) else None, "vLLM's /tokenize")


VLLM_FORCING = Forcing(
    top=vllm_top,
    tokenize=vllm_tokenize,
    detokenize=vllm_detokenize,
    prompt_tokens=vllm_prompt,
    cannot=f"vLLM lists each position's top {TOP_K} at most (its --max-logprobs)",
)
