"""The one backend contract: `stream(request) -> AsyncIterator[Event]`.

A backend yields events and ends with exactly one `Finished` or `StreamError`. Expected
failures (bad URL, 401, missing model) arrive as a `StreamError` event, not as an
exception, so every consumer handles them in the same `match`.

Cancellation is closing the iterator (`aclose()`, or leaving an `async for` early, or
cancelling the task that iterates it): the local backend stops its generation thread at
the next token and releases the llama.cpp context; the remote backend closes the HTTP
response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from phasechat.backends.events import Event, GenerationRequest, Message

LoadState = Literal["idle", "loading", "ready", "failed"]


@dataclass(frozen=True, slots=True)
class TokenCount:
    """A token count, with whether it came from the model's own tokenizer."""

    tokens: int
    estimated: bool


class PromptRefused(ValueError):
    """The model's chat template refused the conversation (a Jinja template that raises:
    "roles must alternate", "System role not supported"). One line, for the user."""


class Stopped(Exception):
    """A teacher-forced reading was asked to stop (its `stop` event set: a view's Esc),
    by the model here (backends/local/teacher.py) or a server (backends/remote/servers/)."""


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A prompt as the engine reads it: the chat-templated text, and the bytes of each of
    its tokens in order (a BOS the text does not show has its own, or none)."""

    text: str
    pieces: tuple[bytes, ...]
    #: who tokenized it: "tokenizer" (the local model) or "server" (its /tokenize)
    source: str


@runtime_checkable
class Backend(Protocol):
    """What the chat layer needs from any model provider."""

    #: whether `count_tokens` uses the model's own tokenizer (else: an estimate)
    exact_token_counts: bool
    #: whether the backend answers one request at a time (a second waits for the first)
    serial: bool

    @property
    def shares_cpu(self) -> bool:
        """Whether the engine competes with the UI for this machine's CPU: a local model
        (in this process, on the CPU or a GPU: its per-token Python shares the
        interpreter lock with the UI), or a server on a loopback address. Every
        CPU-second the UI spends while it generates is then taken from the engine."""
        ...

    @property
    def name(self) -> str:
        """A short label: "local" or the endpoint profile's name."""
        ...

    @property
    def model(self) -> str:
        """The model name as the user should see it."""
        ...

    @property
    def state(self) -> LoadState:
        """Whether the backend is ready to stream."""
        ...

    @property
    def state_detail(self) -> str:
        """A one-line explanation of `state` (the load error, the device...)."""
        ...

    async def start(self) -> None:
        """Load the model or probe the endpoint. Never raises for expected failures:
        those set `state` to "failed" and `state_detail` to the reason."""
        ...

    def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        """Generate one answer. See the module docstring for the protocol.

        `every_s`: the consumer reads the stream about this often (a UI that draws 5
        times a second). A backend that hands tokens across threads may hold them that
        long to deliver them together (each keeps the timestamp taken where it was made);
        None: its own default. A remote stream delivers what the network brings."""
        ...

    @property
    def context_window(self) -> int | None:
        """The context window in tokens, where known (None: unknown)."""
        ...

    @property
    def context_source(self) -> str | None:
        """Where `context_window` comes from, in a few words (None: unknown)."""
        ...

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        """Tokens the messages take as a prompt (chat template included). Raises
        `PromptRefused` when the chat template refuses them."""
        ...

    async def warm(self, messages: tuple[Message, ...]) -> int:
        """Read `messages` into the engine's prefix cache now, so a request that starts
        with them finds them cached; returns the tokens evaluated (0: nothing to do, or
        a backend that cannot be asked to)."""
        ...

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        """Tokens of this prompt the engine's cache holds now (None: unknown).

        Call between requests."""
        ...

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        """`messages` through the engine's own chat template and tokenizer (None: the
        backend cannot say; the prompt's sections are then estimated)."""
        ...

    async def aclose(self) -> None:
        """Release the model or the HTTP client."""
        ...
