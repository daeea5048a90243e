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
ids mean the same only on a server of the same model's tokenizer (the caller checks).
Every number from the server is checked: a log-probability that is not a finite number
at most 0, or a position's listed probabilities adding up to more than 1, is refused
with the reason (`TeacherError`), never compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import httpx

#: the top log-probabilities asked for at each position (vLLM's default --max-logprobs)
TOP_K = 20
#: how far above 1 a position's listed probabilities may add up (float rounding)
SUM_SLACK = 1e-4


class TeacherError(ValueError):
    """The server's answer cannot be used as next-token distributions; the message says
    why, in one line."""


async def vllm_top(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    tokens: Sequence[int],
    start: int,
    k: int = TOP_K,
) -> list[dict[int, float]]:
    """The top-`k` log-probabilities predicting `tokens[start:]` on a vLLM at `base_url`
    (ending in /v1), one request."""
    _check_span(tokens, start)
    body = {
        "model": model,
        "prompt": list(tokens),
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": k,
    }
    answer = await _post(client, f"{base_url.rstrip('/')}/completions", body)
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
    return out


async def llama_server_top(
    client: httpx.AsyncClient,
    base_url: str,
    tokens: Sequence[int],
    start: int,
    k: int = TOP_K,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[int, float]]:
    """The top-`k` log-probabilities predicting `tokens[start:]` on a llama-server at
    `base_url` (its root, or its /v1), one request per position; `progress(done, total)`
    after each."""
    _check_span(tokens, start)
    url = f"{base_url.rstrip('/').removesuffix('/v1')}/completion"
    out = []
    total = len(tokens) - start
    for i in range(start, len(tokens)):
        body = {
            "prompt": list(tokens[:i]),
            "n_predict": 1,
            "n_probs": k,
            "cache_prompt": True,
            "temperature": 0,
        }
        answer = await _post(client, url, body)
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


def _check_span(tokens: Sequence[int], start: int) -> None:
    if not 0 < start < len(tokens):
        raise ValueError(f"the answer starts at {start} of {len(tokens)} tokens")


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        raise TeacherError(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise TeacherError(f"{url}: HTTP {response.status_code}: {response.text[:200]!r}")
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
