"""The backend contract's data: requests in, a closed union of frozen events out.

Every backend turns a `GenerationRequest` into an async stream of `Event`s. Consumers
`match` on the event type; the union is closed, so mypy flags a consumer that forgets a
case when it uses `assert_never`.

Backends never time themselves: the telemetry recorder stamps each event on arrival.
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
class Message:
    """One chat message as a backend sees it."""

    role: Role
    content: str


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
    """The server answered with streaming headers (remote only): the first byte."""

    status: int


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
    """Server-reported prefill progress (llama-server `return_progress`)."""

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


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New chain-of-thought text: what a thinking model writes before its answer.

    Servers stream it apart from the answer (llama-server and older vLLM in
    `delta.reasoning_content`, newer vLLM and OpenRouter in `delta.reasoning`); the local
    backend splits a `<think>...</think>` block off the same way. `tokens` as in
    `TextDelta`.
    """

    text: str
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by the server (OpenAI `usage`). `completion_tokens`
    includes `reasoning_tokens` (`completion_tokens_details`), where a server says."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """llama.cpp's own `timings` object, as the server reported it."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int | None = None


@dataclass(frozen=True, slots=True)
class KVStats:
    """KV-cache occupancy after the request (local backend), with the weight bytes a
    decode step reads, for the roofline hint (bandwidth = tok/s x bytes per token)."""

    used_tokens: int
    capacity_tokens: int
    used_bytes: int
    capacity_bytes: int
    model_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know that does not end the stream
    (e.g. the server ignored `stream: true` and sent its answer whole)."""

    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The stream ended normally (or was cancelled); always the last event."""

    reason: FinishReason


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
    | PromptEvaluated
    | PrefillProgress
    | TextDelta
    | ReasoningDelta
    | Usage
    | ServerTimings
    | KVStats
    | Notice
    | Finished
    | StreamError
)
