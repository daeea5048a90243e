"""What a server family is, as data: one frozen `ServerFamily` per kind of server.

Each module beside this one defines one family (llama_server.py, vllm.py, ...), and
`backends/remote/servers/__init__.py` lists them in `FAMILIES`. The modules that talk to a
server (openai.py, windows.py, server_metrics.py, openai_wire.py) read a family's
fields and never name a family themselves: adding a server is one module here.

A family says how to recognise it (`owned_by` in `GET /v1/models`, else an endpoint
only it answers), where its context
window is (a field of the listing, an endpoint of its own), how it says a prompt does
not fit, its Prometheus names and where its page is, what a request adds for it, how
finely it caches a prompt, and its own per-request timing fields (from a chunk of the
stream, or from the response's headers), each parsed into a `ServerAccount` (or, for
llama.cpp's shape, `ServerTimings` and `PrefillProgress`), with the labels they are
kept under; where it can, how it renders a prompt and reads a token sequence
teacher-forced. What is one family's lives in its own package beside this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import (
    Event,
    GenerationRequest,
    Message,
    PrefillProgress,
    ServerAccount,
    ServerTimings,
    Usage,
)
from phasechat.backends.remote.servers.forcing import Forcing
from phasechat.backends.remote.windows import Window
from phasechat.backends.remote.wire_numbers import Fields, as_count, as_ms

#: A window from one `/v1/models` entry (None: this family's field is not there).
ListedWindow = Callable[[dict[str, Any], Fields | None], Window | None]
#: Why one `/v1/models` entry leaves the window unknown, where the family's listing says
#: so in its own way (Dynamo's `context_window: 0`); None: it does not say.
UnknownWindow = Callable[[dict[str, Any]], str | None]
#: A window from the server's own endpoints: (client, root, headers, model, fields).
OwnWindow = Callable[
    [httpx.AsyncClient, str, dict[str, str], str, Fields | None], Awaitable[Window | None]
]
#: What a refusal says of the sizes (`n_ctx`, `n_prompt_tokens`), from the error object
#: (`{}` when the body had none) and the error's text; None: not this family's refusal.
Refusal = Callable[[dict[str, Any], str], dict[str, object] | None]
#: The family's own account of a request from one parsed stream chunk (None: none in it).
ChunkTiming = Callable[[dict[str, Any], Fields], ServerAccount | None]
#: The family's own account of a request from the response's headers.
HeaderTiming = Callable[[Mapping[str, str], Fields], ServerAccount | None]
#: The prefill's progress from one parsed stream chunk (None: none in it).
ChunkProgress = Callable[[dict[str, Any], Fields], PrefillProgress | None]
#: The engine's own timings of the request from one parsed stream chunk, in llama.cpp's
#: shape, bounded by the `Usage` of the same chunk (None: none in it).
ChunkTimings = Callable[[dict[str, Any], Usage | None, Fields], ServerTimings | None]

#: Is the server at this root this family, by what only it answers (client, root,
#: headers)? Asked only of a server whose listing names no family, within a deadline.
Identify = Callable[[httpx.AsyncClient, str, dict[str, str]], Awaitable[bool]]
#: The prompt as the server renders and tokenizes it (None: it cannot say).
Render = Callable[
    [httpx.AsyncClient, str, dict[str, str], tuple[Message, ...]],
    Awaitable[RenderedPrompt | None],
]


@dataclass(frozen=True, slots=True)
class NativeChat:
    """A family's own chat endpoint, asked instead of `/chat/completions` where only it
    carries the server's account of each answer (Ollama's `/api/chat`: its phases are on
    the final message, and the OpenAI-compatible stream has none). Its stream is one
    JSON object a line (NDJSON)."""

    path: str  # from the server's root: "/api/chat"
    #: the request's JSON body: (request, model)
    body: Callable[[GenerationRequest, str], dict[str, Any]]
    #: the events of one line of its stream (numbers not believed are noted in `Fields`)
    parse: Callable[[str, Fields], list[Event]]


#: The server's own record of the request that just ended, read from an endpoint of
#: its own (client, root, headers, fields): None where it has none.
RequestRecord = Callable[
    [httpx.AsyncClient, str, dict[str, str], Fields], Awaitable[ServerAccount | None]
]
#: How finely a family's prefix cache reuses a prompt, in tokens: 1 is exact (any
#: prefix), n > 1 whole blocks of n, None unknown.
CacheGrain = int | None


@dataclass(frozen=True, slots=True)
class PromNames:
    """A family's Prometheus page: where it is, the names that identify it (`prefix`)
    and, for each figure server_metrics.py reads, the names summed into it."""

    engine: str  # the name a ServerAccount's source carries: "vLLM"
    prefix: str  # a page with a name that starts with it is this family's
    names: Mapping[str, tuple[str, ...]]
    path: str = "/metrics"
    #: a figure read from another name when the page has none of `names` (older servers)
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    #: an info gauge whose labels give the KV pool (`block_size`, `num_gpu_blocks`)
    pool_info: str | None = None
    #: the prompt count is of evaluated tokens only, the cached ones counted apart
    prompt_excludes_cached: bool = False
    #: read at start for every server of the family ("always"), or only where its
    #: window look-up said it serves the page ("if_said": llama-server's /props)
    probe: Literal["always", "if_said"] = "always"
    #: why a server of the family may not serve the page, said once where it does not
    #: (TensorRT-LLM mounts it only with `return_perf_metrics`)
    absent: str = ""
    #: its record of each request, served with the page and read once the answer is
    #: over (TensorRT-LLM's `/perf_metrics`): the request's own figures, preferred to
    #: the page's differences
    record: RequestRecord | None = None


@dataclass(frozen=True, slots=True)
class ServerFamily:
    """One kind of server, everything phasechat does differently for it."""

    name: str
    #: `owned_by` values of its `GET /v1/models` entries
    owned_by: tuple[str, ...] = ()
    #: how to recognise it where its listing names no owner of its own (TGI's names
    #: the model, Ollama's the model's namespace): an endpoint only it answers
    identify: Identify | None = None
    listed_window: ListedWindow | None = None
    unknown_window: UnknownWindow | None = None
    own_window: OwnWindow | None = None
    #: ask `own_window` before the listing (llama-server: the slot's window is in /props)
    own_window_first: bool = False
    refusal: Refusal | None = None
    metrics: PromNames | None = None
    #: fields added to every chat-completion request (only this family accepts them)
    request_extras: Mapping[str, object] = field(default_factory=dict)
    cache_grain: CacheGrain = None
    chunk_timing: ChunkTiming | None = None
    header_timing: HeaderTiming | None = None
    #: the response headers `header_timing` reads its account from: a reply that carries
    #: none of them is not handed to it (empty: every reply is)
    timing_headers: tuple[str, ...] = ()
    #: its prefill's progress and its engine's timings on a chunk, read from any server
    #: that sends them whatever its listing claimed (a proxy passes them through)
    progress: ChunkProgress | None = None
    timings: ChunkTimings | None = None
    #: the label of those timings in an answer's figures (`Metrics.server_source`): read
    #: from a stream, or (True) counted by the local engine in the same shape
    timings_source: Callable[[bool], str] | None = None
    #: who says the figures kept under each of its labels, as a line names them
    said_by: Mapping[str, str] = field(default_factory=dict)
    #: the prompt as the server reads it, where it can say (llama-server's
    #: /apply-template and /tokenize, vLLM's /tokenize and /detokenize):
    #: (client, root, headers, messages)
    render: Render | None = None
    #: its own chat endpoint, asked instead of the OpenAI one (None: the OpenAI one)
    native: NativeChat | None = None
    #: how it reads a given token sequence, teacher-forced (None: it gives no
    #: log-probabilities of tokens it did not sample; backends/remote/servers/forcing.py)
    forcing: Forcing | None = None
    #: where its documentation says the above (shown in docs/backends.md's table)
    docs: str = ""


def positive(value: object) -> int | None:
    """A positive count of at most MAX_TOKENS, else None."""
    n = as_count(value)
    return n if n else None


def checked_window(value: object, name: str, f: Fields | None) -> int | None:
    """A window from field `name`: a positive count of at most MAX_TOKENS, else None
    (noted in `f` when the server said something unbelievable)."""
    n = positive(value)
    if n is None and value is not None and f is not None:
        f.ignore(name, value)
    return n


def sizes(n_ctx: str, n_prompt: str) -> dict[str, object]:
    """The sizes a refusal's text gives, each kept only when believable."""
    said = {"n_ctx": positive(int(n_ctx)), "n_prompt_tokens": positive(int(n_prompt))}
    return {k: v for k, v in said.items() if v is not None}


def seconds_ms(obj: dict[str, Any], key: str, where: str, f: Fields) -> float | None:
    """A duration the server gives in seconds, as ms (checked as `Fields.ms` checks)."""
    value = obj.get(key)
    if value is None:
        return None
    number = not isinstance(value, bool) and isinstance(value, int | float)
    checked = as_ms(value * 1000) if number else None
    if checked is None:
        f.ignore(f"{where}.{key}", value)
    return checked
