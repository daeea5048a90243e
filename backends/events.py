"""The backend contract's data: requests in, a closed union of frozen events out.

Every backend turns a `GenerationRequest` into an async stream of `Event`s. Consumers
`match` on the event type; the union is closed, so mypy flags a consumer that forgets a
case when it uses `assert_never`.

Backends never time themselves: the telemetry recorder stamps each event on arrival,
with one exception: a backend stamps each `TextDelta` and `ReasoningDelta` where it
was made or received (`t_ns`, the same process-wide `perf_counter_ns` clock): the local
model where its thread produced the token, the remote backend where the chunk's bytes
were read from the socket. So a busy event loop or a slow reader of the stream cannot
stretch or bunch the token times.
What a server *reports* about its own timing travels as data (`ServerTimings`, `Usage`)
and is kept beside the client's measurement, never instead of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Role = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length", "cancelled", "error", "other"]
ErrorKind = Literal[
    "connection",  # refused, unknown host, reset, TLS
    "timeout",  # no first token in time
    "stalled",  # tokens stopped arriving mid-answer
    "auth",  # 401 / 403
    "not_found",  # 404: wrong base URL or model
    "rate_limited",  # 429
    "server",  # 5xx, or an error object inside the stream
    "bad_request",  # 4xx the user can fix (context too long, bad field)
    "protocol",  # a reply that is not the streamed SSE we asked for
    "model",  # local model missing, corrupt, or failed to load
    "context_overflow",  # prompt does not fit the context window
]


@dataclass(frozen=True, slots=True)
class AnswerTokens:
    """The token ids an engine made for one answer, in order, each token's bytes
    (control tokens as their text), and the vocabulary they belong to (`vocab`: the
    engine's identity, e.g. the local model's file; ids mean nothing to another).

    The local backend sends it once an answer is done; every token it sampled is here,
    thinking and a stop string's tokens included, the end-of-generation token not."""

    ids: tuple[int, ...]
    pieces: tuple[bytes, ...]
    vocab: str


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message as a backend sees it.

    `tokens`: an answer's own token ids (`AnswerTokens`), where the engine that wrote it
    said: the same engine then sends the answer back as those ids, not as its text
    tokenized again (which may split a sampled answer differently, and so re-read it).
    Not part of a message's identity: two messages with the same role and text are equal.
    """

    role: Role
    content: str
    tokens: AnswerTokens | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What to generate. Sampling defaults follow llama.cpp's."""

    messages: tuple[Message, ...]
    max_tokens: int = 512
    temperature: float = 0.8
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    """The server answered with streaming headers (remote only): the first byte.
    `connect_ms`: the time this request spent opening its connection (TCP and TLS; 0 on
    a kept-alive one), None where the transport did not say."""

    status: int
    connect_ms: float | None = None
    #: when the request's body was all written (`perf_counter_ns`; None: not said)
    t_body_sent_ns: int | None = None


@dataclass(frozen=True, slots=True)
class ModelLoading:
    """The request waits for the model to load (the local backend, asked before its load
    ended): a wait of its own, not prefill. `ModelLoaded` ends it, or a `StreamError`
    when the load fails."""


@dataclass(frozen=True, slots=True)
class ModelLoaded:
    """The model the request waited for is loaded: prefill starts now. `t_ns`: when the
    load ended, stamped where it ended (the load's thread, the `perf_counter_ns` clock):
    the event reaches the consumer later."""

    t_ns: int | None = None


@dataclass(frozen=True, slots=True)
class PromptEvaluated:
    """Prompt accounting known before the first token (local backend: exact).

    `cached_tokens` were reused from the engine's prefix cache; `evaluated_tokens` were
    actually run through prefill (prompt_tokens - cached_tokens, except when the engine
    replays one token to refresh logits).
    """

    prompt_tokens: int
    cached_tokens: int
    evaluated_tokens: int


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """Prefill progress: llama-server's `return_progress`, or the local backend after each
    batch. `processed` counts the prompt tokens done, cached ones included (llama-server's
    shape: it runs from `cached` to `total`); `time_ms` is the engine's time so far."""

    total: int
    cached: int
    processed: int
    time_ms: float


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New answer text.

    `tokens` is how many model tokens this delta stands for when the backend knows
    (local: exactly one per event, even when `text` is empty because a multi-byte
    character is still incomplete); None when it cannot know (a remote chunk is not
    a token).
    """

    text: str
    tokens: int | None = None
    #: when the backend produced it (`perf_counter_ns`), if it knows better than arrival
    t_ns: int | None = None


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New chain-of-thought text: what a thinking model writes before its answer.

    Servers stream it apart from the answer (llama-server and older vLLM in
    `delta.reasoning_content`, newer vLLM and OpenRouter in `delta.reasoning`); the local
    backend splits a `<think>...</think>` block off the same way. `tokens` and `t_ns` as
    in `TextDelta`.
    """

    text: str
    tokens: int | None = None
    t_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by the server (OpenAI `usage`). `completion_tokens`
    includes `reasoning_tokens` (`completion_tokens_details`), where a server says.
    None: not said, or not believed (backends/remote/wire_numbers.py)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """llama.cpp's own `timings` object, as the server reported it (None: a value that
    was missing or not believed, backends/remote/wire_numbers.py)."""

    prompt_n: int | None
    prompt_ms: float | None
    predicted_n: int | None
    predicted_ms: float | None
    cache_n: int | None = None
    #: speculative decoding (a draft model): tokens drafted and how many were accepted
    draft_n: int | None = None
    draft_n_accepted: int | None = None


@dataclass(frozen=True, slots=True)
class PartMeaning:
    """What a server's own figure for one part of the wait covers, in the server's terms
    (read from its source): the name it is shown under, and what it runs from and to.
    Dynamo's `prefill_wait_time_ms` is no queue but its frontend's tokenizing and
    routing: it is shown as that, not as "queued"."""

    name: str
    means: str


@dataclass(frozen=True, slots=True)
class ServerAccount:
    """A server's own account of the request, from its `/metrics` read before and after
    it (backends/remote/server_metrics.py) or from its own per-request fields (its family's
    `chunk_timing` / `header_timing`, backends/remote/servers/): what it measured (ms) and
    counted, and the KV pool
    it shares among all requests. `unknown` says why the per-request figures are None
    (another request ran at the same time); the pool is the server's either way.
    `used_share`: how full the pool was when the request was sent (0-1). `doubts`: one
    line for each figure the request itself rules out (None here; the backend says them
    as doubting notices)."""

    source: str
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    generated_tokens: int | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    pool_tokens: int | None = None
    block_tokens: int | None = None
    used_share: float | None = None
    unknown: str | None = None
    doubts: tuple[str, ...] = ()
    #: the share of the prompt found in a KV cache (0-1: Dynamo's router's `kv_hit_rate`)
    kv_hit_share: float | None = None
    #: the workers that ran the prefill and the decode, where a server splits them
    #: (Dynamo's disaggregated serving); an id as the server gave it, shown, never obeyed
    prefill_worker: str | None = None
    decode_worker: str | None = None
    #: what `queue_ms` and `prefill_ms` cover where the server defines them otherwise
    #: than a queue before the prefill and the prefill (None: those, as named)
    queue_means: PartMeaning | None = None
    prefill_means: PartMeaning | None = None
    #: the wait for the model to load before this request's prompt was read, as the
    #: server measured it (Ollama's `load_duration`; 0: it was loaded)
    load_ms: float | None = None


@dataclass(frozen=True, slots=True)
class KVStats:
    """KV-cache occupancy after the request (local backend), with the weight bytes a
    decode step reads, for the roofline hint (bandwidth = tok/s x bytes per token)."""

    used_tokens: int
    capacity_tokens: int
    used_bytes: int
    capacity_bytes: int
    model_bytes: int = 0
    #: with layers on a GPU, the bytes a decode step reads from the GPU's memory and from
    #: the host's (the weights of the layers on each and their KV cache so far: see
    #: backends/local/offload.py); None: every layer on the CPU
    gpu_bytes: int | None = None
    cpu_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class EngineThreads:
    """The local engine's decode thread count: once as a request starts, and again
    whenever it changes mid-answer (backends/local/threads.py). `at_token`: the answer's
    token count at that moment; `reason`: why, in a few words."""

    threads: int
    max_threads: int
    reason: str
    at_token: int = 0


@dataclass(frozen=True, slots=True)
class CpuBusy:
    """How busy other processes kept this machine's CPUs while the local engine decoded
    an answer (backends/local/threads.py `CpuShare`, from /proc/stat less the engine's own CPU
    time): `others` CPUs' worth of work on average, of the `cpus` it may run on. Sent
    once, after the answer's last token; not sent when the span was too short to tell."""

    others: float
    cpus: int


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know that does not end the stream
    (e.g. the server ignored `stream: true` and sent its answer whole). `doubt`: it
    names figures of the server's that were not believed (backends/remote/wire_numbers.py),
    which the answer's figures then carry as a warning."""

    text: str
    doubt: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """The stream ended normally (or was cancelled); always the last event.

    Two times a remote backend stamps itself (the `perf_counter_ns` clock), because the
    event is yielded later than they happened:
    - `t_silent_ns`: the chunk that gave the finish reason arrived without text. A server
      that counts a token it streams no text for (vLLM and llama-server count the
      end-of-sequence token in `completion_tokens`, and send only `finish_reason` for it)
      made that token one decode step after the last visible one: the count ends here.
    - `t_ns`: the stream ended (`[DONE]`), before the backend asked the server for its own
      account of the request (`/metrics`), which is not the answer's time.
    """

    reason: FinishReason
    t_silent_ns: int | None = None
    t_ns: int | None = None


@dataclass(frozen=True, slots=True)
class StreamError:
    """The stream failed; always the last event. `message` is one line for a human."""

    kind: ErrorKind
    message: str
    retryable: bool = False
    status: int | None = None
    retry_after_s: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


Event = (
    ResponseStarted
    | ModelLoading
    | ModelLoaded
    | PromptEvaluated
    | PrefillProgress
    | TextDelta
    | ReasoningDelta
    | Usage
    | ServerTimings
    | ServerAccount
    | KVStats
    | EngineThreads
    | CpuBusy
    | Notice
    | AnswerTokens
    | Finished
    | StreamError
)
