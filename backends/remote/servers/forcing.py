"""Teacher-forced next-token distributions from a server, as every family that can
give them gives them: a token sequence read on the server, and at each position of its
answer the top k log-probabilities of the token that comes next
(telemetry/divergence.py `compare_top` compares two sides' lists).

A family's four reads are its `Forcing` (its `ServerFamily.forcing`: vLLM's in
servers/vllm/teacher.py, llama-server's in servers/llama_server/teacher.py); a family
without one (Ollama, OpenAI, ...) gives no log-probabilities of tokens it did not
sample itself. `Server` says where one server is; the checks below are every family's.

Both need the sequence as token ids of the server's own vocabulary: a local model's
ids mean the same only on a server of the same model's tokenizer (the caller checks,
with `tokenize` and `detokenize`). A server's answer comes as text (neither sends the
ids it sampled on the stream phasechat reads): `tokenize` splits it with the server's
own tokenizer, which a sampler may have split otherwise (`prompt_tokens` gives the
prompt's ids as the server's template renders it).

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
from phasechat.backends.remote.urls import endpoint, root_of
from phasechat.backends.untrusted import as_text

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


def ids_of(value: object, where: str) -> list[int]:
    """A list of token ids as `where` sent it, each checked (`token_id`)."""
    if not isinstance(value, list):
        raise TeacherError(f"{where} sent no token ids")
    return [token_id(v) for v in value]


def check_span(tokens: Sequence[int], start: int) -> None:
    """An answer that starts at `start` of `tokens` has a prompt before it and a token."""
    if not 0 < start < len(tokens):
        raise ValueError(f"the answer starts at {start} of {len(tokens)} tokens")


async def ask(server: Server, url: str, body: dict[str, Any]) -> Any:
    """The JSON answer of a POST of `body` to `url`; anything else is a `TeacherError`
    whose text has the key taken out."""
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


def field(entry: object, key: str) -> Any:
    """`entry[key]` of a listed token (a `TeacherError` when it has none)."""
    if not isinstance(entry, dict) or key not in entry:
        raise TeacherError(f"a listed token has no {key!r}")
    return entry[key]


def token_id(value: object) -> int:
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


def checked(listed: dict[int, Any], position: int) -> dict[int, float]:
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
