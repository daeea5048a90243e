"""Teacher-forced next-token distributions from a server: a token sequence read on the
server, and at each position of its answer the top k log-probabilities of the token
that comes next (telemetry/divergence.py `compare_top` compares two sides' lists).

- vLLM: one request, `/v1/completions` with the sequence as token ids and
  `prompt_logprobs=k`: every prompt position's top k (at most the server's
  `--max-logprobs`, 20 by default) plus the token that is there. The whole sequence is
  read in one prefill, as the local teacher reads it (backends/teacher.py).
- llama-server: its API has no log-probabilities of prompt tokens, only the top
  `n_probs` of the token it generates next (`/completion`'s `completion_probabilities`).
  So each answer position is its own request: the tokens before it as the prompt,
  `n_predict` 1, `cache_prompt` on, so the slot keeps the prefix and reads one new token
  a request. What it cannot do: read the answer in one evaluation (N positions are N
  round trips, each a batch of one token, numerically another path than one prefill);
  give more than the top `n_probs`; keep its cache when other clients share its slots
  (a request then reads the whole prefix again: slower, the same numbers).

Both need the sequence as token ids of the server's own vocabulary: a local model's
ids mean the same only on a server of the same model's tokenizer (the caller checks,
with `tokenize` and `detokenize`). A server's answer comes as text (neither sends the
ids it sampled on the stream phasechat reads): `tokenize` splits it with the server's
own tokenizer, which a sampler may have split otherwise (`prompt_tokens` gives the
prompt's ids as the server's template renders it).

`VLLM_FORCING` and `LLAMA_SERVER_FORCING` hold each family's four reads (`Forcing`,
its `ServerFamily.forcing`); a family without one (Ollama, OpenAI, ...) gives no
log-probabilities of tokens it did not sample itself.
Every number from the server is checked: a log-probability that is not a finite number
at most 0, or a position's listed probabilities adding up to more than 1, is refused
with the reason (`TeacherError`), never compared.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from phasechat.backends.events import Message
from phasechat.backends.teacher import Stopped
from phasechat.backends.token_text import llama_piece, pieces_of
from phasechat.backends.urls import endpoint, root_of
from phasechat.backends.wire_text import as_text

#: the top log-probabilities asked for at each position (vLLM's default --max-logprobs)
TOP_K = 20
#: how far above 1 a position's listed probabilities may add up (float rounding)
SUM_SLACK = 1e-4


class TeacherError(ValueError):
    """The server's answer cannot be used as next-token distributions; the message says
    why, in one line."""


@dataclass(frozen=True, slots=True)
class Server:
    """Where one server is and how to ask it: its client, base URL (with or without
    /v1), the headers of a plain request (the API key, where there is one), the model
    asked for, and what takes the key out of a text (an error body that echoes it)."""

    client: httpx.AsyncClient
    base_url: str
    headers: Mapping[str, str]
    model: str
    scrub: Callable[[str], str] = str

    @property
    def root(self) -> str:
        return root_of(self.base_url)

    @property
    def v1(self) -> str:
        return endpoint(self.root, "/v1")


#: A position's listed log-probabilities: token id -> log-probability.
Listed = dict[int, float]


@dataclass(frozen=True, slots=True)
class Forcing:
    """What a family's server does for teacher forcing: the top k predicting
    `tokens[start:]` (`top`), a text's ids and each one's bytes without special tokens
    (`tokenize`), ids' text (`detokenize`), and a chat's prompt ids as its template
    renders them (`prompt_tokens`). `cannot`: what its figures cannot be, shown beside
    them."""

    top: Callable[
        [Server, Sequence[int], int, Callable[[int, int], None] | None, threading.Event | None],
        Awaitable[list[Listed]],
    ]
    tokenize: Callable[[Server, str], Awaitable[tuple[list[int], tuple[bytes, ...]]]]
    detokenize: Callable[[Server, Sequence[int]], Awaitable[str]]
    prompt_tokens: Callable[[Server, tuple[Message, ...]], Awaitable[list[int]]]
    cannot: str


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
    _check_span(tokens, start)
    body = {
        "model": server.model,
        "prompt": list(tokens),
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": k,
    }
    answer = await _post(server, endpoint(server.v1, "/completions"), body)
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
        out.append(_checked({_token_id(key): _field(v, "logprob") for key, v in entry.items()}, i))
    if progress is not None:
        progress(len(out), len(out))
    return out


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
    _check_span(tokens, start)
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
        answer = await _post(server, url, body)
        try:
            top = answer["completion_probabilities"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise TeacherError(
                "llama-server's answer has no completion_probabilities[0].top_logprobs"
            ) from None
        if not isinstance(top, list) or not top:
            raise TeacherError(f"llama-server listed no tokens at position {i}")
        listed = {_token_id(_field(t, "id")): _field(t, "logprob") for t in top}
        out.append(_checked(listed, i))
        if progress is not None:
            progress(i - start + 1, total)
    return out


async def vllm_tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
    """`text`'s ids on vLLM, no special tokens added, and each one's bytes."""
    body = {
        "model": server.model,
        "prompt": text,
        "add_special_tokens": False,
        "return_token_strs": True,
    }
    said = await _post(server, endpoint(server.root, "/tokenize"), body)
    ids = _ids(said.get("tokens") if isinstance(said, dict) else None, "vLLM's /tokenize")
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
    said = await _post(
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
    said = await _post(server, endpoint(server.root, "/tokenize"), body)
    return _ids(said.get("tokens") if isinstance(said, dict) else None, "vLLM's /tokenize")


async def llama_server_tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
    """`text`'s ids on llama-server, no special token added nor parsed (an answer that
    spells "<|im_end|>" is text), and each one's bytes."""
    body = {"content": text, "add_special": False, "parse_special": False, "with_pieces": True}
    said = await _post(server, endpoint(server.root, "/tokenize"), body)
    listed = said.get("tokens") if isinstance(said, dict) else None
    if not isinstance(listed, list):
        raise TeacherError("llama-server's /tokenize sent no tokens")
    ids, pieces = [], []
    for token in listed:
        piece = llama_piece(_field(token, "piece"))
        if piece is None:
            raise TeacherError("llama-server's /tokenize sent a piece that is not text or bytes")
        ids.append(_token_id(_field(token, "id")))
        pieces.append(piece)
    if b"".join(pieces) != text.encode("utf-8"):
        raise TeacherError("llama-server's tokens do not spell the text they were made of")
    return ids, tuple(pieces)


async def llama_server_detokenize(server: Server, ids: Sequence[int]) -> str:
    said = await _post(server, endpoint(server.root, "/detokenize"), {"tokens": list(ids)})
    text = said.get("content") if isinstance(said, dict) else None
    if not isinstance(text, str):
        raise TeacherError("llama-server's /detokenize sent no text")
    return as_text(text)


async def llama_server_prompt(server: Server, messages: tuple[Message, ...]) -> list[int]:
    """The ids of `messages` as a chat request reads them: its template (/apply-template),
    then its tokenizer with special tokens parsed and added (as the server does)."""
    body = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
    said = await _post(server, endpoint(server.root, "/apply-template"), body)
    prompt = said.get("prompt") if isinstance(said, dict) else None
    if not isinstance(prompt, str):
        raise TeacherError("llama-server's /apply-template sent no prompt")
    read = {"content": prompt, "add_special": True, "parse_special": True}
    said = await _post(server, endpoint(server.root, "/tokenize"), read)
    return _ids(said.get("tokens") if isinstance(said, dict) else None, "llama-server's /tokenize")


VLLM_FORCING = Forcing(
    top=vllm_top,
    tokenize=vllm_tokenize,
    detokenize=vllm_detokenize,
    prompt_tokens=vllm_prompt,
    cannot=f"vLLM lists each position's top {TOP_K} at most (its --max-logprobs)",
)
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


def _ids(value: object, where: str) -> list[int]:
    if not isinstance(value, list):
        raise TeacherError(f"{where} sent no token ids")
    return [_token_id(v) for v in value]


def _check_span(tokens: Sequence[int], start: int) -> None:
    if not 0 < start < len(tokens):
        raise ValueError(f"the answer starts at {start} of {len(tokens)} tokens")


async def _post(server: Server, url: str, body: dict[str, Any]) -> Any:
    try:
        response = await server.client.post(url, json=body, headers=dict(server.headers))
    except httpx.HTTPError as exc:
        raise TeacherError(server.scrub(f"{url}: {type(exc).__name__}: {exc}")) from None
    if response.status_code != 200:
        said = server.scrub(as_text(response.text[:200]))
        raise TeacherError(server.scrub(f"{url}: HTTP {response.status_code}: {said!r}"))
    try:
        return response.json()
    except ValueError:
        raise TeacherError(f"{url}: the answer is not JSON") from None


def _field(entry: object, key: str) -> Any:
    if not isinstance(entry, dict) or key not in entry:
        raise TeacherError(f"a listed token has no {key!r}")
    return entry[key]


def _token_id(value: object) -> int:
    """A token id as a server writes it (vLLM: a string key, llama-server: a number)."""
    if isinstance(value, bool):
        raise TeacherError(f"token id {value!r} is not a number")
    if isinstance(value, int):
        token = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        token = int(value)
    else:
        raise TeacherError(f"token id {value!r} is not a number")
    if token < 0:
        raise TeacherError(f"token id {token} is negative")
    return token


def _checked(listed: dict[int, Any], position: int) -> dict[int, float]:
    """One position's listed log-probabilities, each a finite number at most 0 and their
    probabilities adding up to at most 1."""
    out: dict[int, float] = {}
    for token, value in listed.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TeacherError(f"position {position}: logprob {value!r} is not a number")
        if not math.isfinite(value) or value > 0:
            raise TeacherError(f"position {position}: logprob {value!r} is not a log-probability")
        out[token] = float(value)
    if sum(math.exp(v) for v in out.values()) > 1 + SUM_SLACK:
        raise TeacherError(f"position {position}: the listed probabilities add up to more than 1")
    return out
