"""What each engine holds after a turn controller's requests (`EngineHeld`), and each
answer's prompt anatomy (telemetry/anatomy.py) against it: the request's messages as
parts, the engine's rendering of them, the answer's counts and times, and what the engine
held before this request (the previous one on the same backend: its prompt and answer).

The rendering is asked of the backend when the request starts (the local model's
tokenizer on its own thread, llama-server's /apply-template and /tokenize, vLLM's
/tokenize and /detokenize), so the panel can name the section a long prefill is
reading; the sections' cached and read counts follow from the engine's own count once
it is known. An engine that caches whole blocks (`cache_grain_of`: the block size its
/metrics states, else its server family's) is held to reuse only those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

from phasechat.backends.base import Backend, RenderedPrompt
from phasechat.backends.events import AnswerTokens, Message
from phasechat.backends.remote.capability import RemoteServer
from phasechat.backends.tokens import estimate_once
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.trim.summarize import SUMMARY_HEADER
from phasechat.telemetry.anatomy import (
    BREAK_MIN_TOKENS,
    Anatomy,
    HeldTokens,
    Part,
    find_break,
    locate,
    reusable,
    split_estimated,
    split_exact,
)
from phasechat.telemetry.metrics import Metrics

#: What an estimated prompt's text is made of: the parts, one per line (no template).
_JOIN = "\n"


@dataclass(frozen=True, slots=True)
class Held:
    """What an engine held after a request: its prompt's text (templated where known)
    then the answer, and how many tokens that was.

    Where the engine's tokenizer said (`source` not "estimate"): the prompt's tokens
    (`pieces`, each as its bytes), then the answer's where the engine said them too
    (`answer_known`: the local model), and where the answer starts in `text`
    (`answer_at`). `inferred`: read from a saved chat's last exchange, not seen sent (a
    new process): believed only where the engine's cached count agrees with it."""

    text: str
    tokens: int | None
    #: whose tokenizer counted it (`Anatomy.source`; None: not said)
    source: str | None = None
    pieces: tuple[bytes, ...] | None = None
    answer_known: bool = False
    answer_at: int = 0
    inferred: bool = False


#: How many tokens short of the prefix a held prompt shares with the next one an
#: engine's cached count may be and still confirm it held that prompt: llama-server
#: re-reads the last token of a prompt held whole; a few more is the template's tail.
CONFIRM_SLACK = 4


def parts_of(messages: Sequence[Message]) -> list[Part]:
    """The user's parts of a request: the system prompt (and the trimmer's summary, which
    is appended to it), each earlier message, and the new one."""
    parts = []
    for i, m in enumerate(messages):
        if i == 0 and m.role == "system":
            head, header, summary = m.content.partition(SUMMARY_HEADER)
            if header:
                system = head.removesuffix("\n\n")
                if system:
                    parts.append(Part("system", 0, system))
                parts.append(Part("summary", 0, header + summary))
            elif m.content:
                parts.append(Part("system", 0, m.content))
        else:
            parts.append(Part("new" if i == len(messages) - 1 else "history", i, m.content))
    return parts


def ms_per_evaluated_token(m: Metrics) -> float | None:
    """The prefill's cost of one evaluated token: the engine's own account where it gives
    one (llama-server's `timings`, the local perf counters), else TTFT (less a wait for
    the model to load) / evaluated."""
    if m.server_prompt_ms and m.server_prompt_n:
        return m.server_prompt_ms / m.server_prompt_n
    if (ttft := m.ttft_ready_ms) is not None and m.evaluated_prompt_tokens:
        return ttft / m.evaluated_prompt_tokens
    return None


def anatomy_of(
    messages: Sequence[Message],
    rendered: RenderedPrompt | None,
    metrics: Metrics,
    held: Held | None,
    grain: int = 1,
) -> Anatomy | None:
    """The sections of a finished request (None: its prompt count is unknown, a request
    refused before it was read), with the cache break against `held` if there was one.
    `grain`: the engine caches whole blocks of this many tokens (1: any prefix)."""
    total = metrics.prompt_tokens
    if not total:
        return None
    parts = parts_of(messages)
    cached = metrics.cached_tokens if metrics.cache_reported else None
    ms = ms_per_evaluated_token(metrics)
    anatomy = None
    if rendered is not None and len(rendered.pieces) <= total:
        # a BOS the server adds to what /tokenize showed: the template's
        pieces = (b"",) * (total - len(rendered.pieces)) + rendered.pieces
        anatomy = split_exact(rendered.text, pieces, parts, cached, ms, rendered.source)
    if anatomy is None:
        anatomy = split_estimated(parts, total, cached, ms, estimate_once)
        text = _JOIN.join(p.text for p in parts)
        spans = [(s, e, i) for i, (s, e) in enumerate(locate(text, parts) or [])]
        # the estimate's sections are in `parts` order: map each part to its section
        index = {(s.kind, s.message_index): n for n, s in enumerate(anatomy.sections)}
        spans = [(s, e, index[(parts[i].kind, parts[i].message_index)]) for s, e, i in spans]
        anatomy = Anatomy(anatomy.sections, anatomy.source, None, text, tuple(spans))
    if held is None or not anatomy.text:
        return anatomy
    sent = _pieces(rendered, total) if anatomy.source != "estimate" else None
    if held.inferred:
        if sent is None or held.pieces is None or rendered is None:
            return anatomy
        # rendered as this prompt was: a BOS the rendering does not show, as b"" too
        held = replace(held, pieces=sent[: len(sent) - len(rendered.pieces)] + held.pieces)
        if not _confirmed(held, sent, cached, grain):
            return anatomy
    if held.source is not None and (held.source == "estimate") != (anatomy.source == "estimate"):
        # one text is templated, the other is not: their difference says nothing
        return anatomy
    again = None
    if held.tokens is not None and cached is not None:
        # the last, partial block of what it held is read again on every turn
        again = reusable(held.tokens, grain) - cached
    tokens = None
    if sent is not None and held.pieces is not None:
        shift = max(0, len(b"".join(sent)) - len(anatomy.text.encode("utf-8")))
        tokens = HeldTokens(
            held.pieces, sent, held.answer_known, held.answer_at, cached, shift, grain
        )
    brk = find_break(
        held.text,
        anatomy.text,
        anatomy.spans,
        anatomy.sections,
        again,
        estimated=anatomy.source == "estimate",
        tokens=tokens,
        grain=grain,
    )
    return Anatomy(
        anatomy.sections,
        anatomy.source,
        brk,
        anatomy.text,
        anatomy.spans,
        anatomy.cached_chars,
    )


def _pieces(rendered: RenderedPrompt | None, total: int) -> tuple[bytes, ...] | None:
    """The prompt's tokens as the engine read them (a BOS the rendering did not show
    as b""), None where not known."""
    if rendered is None or len(rendered.pieces) > total:
        return None
    return (b"",) * (total - len(rendered.pieces)) + rendered.pieces


def _confirmed(
    held: Held, sent: tuple[bytes, ...] | None, cached: int | None, grain: int = 1
) -> bool:
    """Whether the engine's cached count says it held `held` (a chat's last exchange,
    inferred): it reused about as much of this prompt as the two share, token by token
    (as much as whole blocks of `grain` allow).
    An engine that held something else (nothing: a new local model; another chat)
    reused less, or more."""
    if sent is None or held.pieces is None or cached is None:
        return False
    common = 0
    for a, b in zip(held.pieces, sent, strict=False):
        if a != b:
            break
        common += 1
    if common < BREAK_MIN_TOKENS:  # nothing shared worth a claim
        return False
    if grain > 1:
        # whole blocks of what the two share (the last shared token may be re-read,
        # as when a prompt is held whole); none at all confirms nothing
        whole = (common - 1) // grain * grain
        return 0 < whole <= cached <= common
    return common - CONFIRM_SLACK <= cached <= common


def cache_grain_of(backend: Backend, metrics: Metrics) -> int:
    """How finely `backend`'s engine reuses a cached prompt, in tokens: the block size
    its own /metrics stated for this request, else its server family's (vLLM: 16 by
    default), else 1 (any prefix: the local model, llama-server, or not known)."""
    if metrics.server_kv_block_tokens:
        return metrics.server_kv_block_tokens
    if isinstance(backend, RemoteServer) and backend.family.cache_grain:
        return backend.family.cache_grain
    return 1


def held_after(
    anatomy: Anatomy | None,
    answer: str,
    metrics: Metrics,
    rendered: RenderedPrompt | None = None,
    tokens: AnswerTokens | None = None,
) -> Held | None:
    """What the engine holds once this answer is done: the prompt, then the answer
    (token by token where the engine said: `rendered`, the answer's `tokens`)."""
    if anatomy is None or not anatomy.text:
        return None
    count = None
    if metrics.prompt_tokens is not None:
        count = metrics.prompt_tokens + metrics.output_tokens
    joiner = "" if anatomy.source != "estimate" else _JOIN
    text = anatomy.text + joiner + answer
    at = len(anatomy.text + joiner)
    if anatomy.source == "estimate":
        return Held(text, count, "estimate", answer_at=at)
    pieces = _pieces(rendered, metrics.prompt_tokens or 0)
    if pieces is not None and tokens is not None:
        return Held(text, count, anatomy.source, pieces + tokens.pieces, True, at)
    return Held(text, count, anatomy.source, pieces, False, at)


def inferred_held(rendered: RenderedPrompt, answer: str, metrics: Metrics | None) -> Held:
    """What an engine holds if it served a saved chat's last exchange (the prompt
    `rendered`, then its `answer`, whose saved `metrics` count both) last: to be
    confirmed by its cached count at the next request (`anatomy_of`)."""
    count = None
    if metrics is not None and metrics.prompt_tokens is not None:
        count = metrics.prompt_tokens + metrics.output_tokens
    text = rendered.text + answer
    return Held(
        text, count, rendered.source, rendered.pieces, False, len(rendered.text), inferred=True
    )


def section_at(rendered: RenderedPrompt | None, messages: Sequence[Message], token: int) -> str:
    """The name of the section that prompt token `token` lies in ("" when unknown): for
    the panel while a long prefill runs."""
    if rendered is None:
        return ""
    parts = parts_of(messages)
    spans = locate(rendered.text, parts)
    if spans is None:
        return ""
    chars = len(b"".join(rendered.pieces[:token]).decode("utf-8", errors="ignore"))
    for (start, end), part in zip(spans, parts, strict=True):
        if chars < end:
            return name_of(part.kind, part.message_index) if chars >= start else "template"
    return "template"


def name_of(kind: str, message_index: int | None) -> str:
    """A section as the panel and the prompt view name it."""
    if kind in ("history", "new"):
        return f"{'new message' if kind == 'new' else 'message'} {message_index}"
    return {"system": "system prompt", "summary": "summary"}.get(kind, "template")


#: How long a finished answer waits for its prompt's rendering (then: estimated).
RENDER_WAIT_S = 5.0
#: A rendering asked of a backend still loading: ask again once the answer is done.
RENDER_AGAIN = RenderedPrompt("", (), "again")


class EngineHeld:
    """What each backend's engine holds after one turn controller's last request on it,
    and each answer's prompt anatomy against it (chat/turns.py keeps one)."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}
        #: a saved chat's last exchange (its prompt and answer) as it was opened: what
        #: the engine that wrote it may hold still, for a process that did not send it
        self.opened: tuple[tuple[Message, ...], ChatMessage] | None = None

    def held(self, backend: str) -> Held | None:
        """What the last request on `backend` left in its engine."""
        return self._held.get(backend)

    def forget(self, backend: str) -> None:
        """A request on `backend` was stopped: what its engine holds now is not known."""
        self._held.pop(backend, None)

    async def anatomize(
        self,
        backend: Backend,
        messages: tuple[Message, ...],
        metrics: Metrics,
        answer: ChatMessage,
        rendering: asyncio.Future[RenderedPrompt | None],
    ) -> tuple[RenderedPrompt | None, Anatomy | None]:
        """The answer's prompt rendering and its sections and cache break; what the
        engine holds after it is kept for the next request on `backend`."""
        rendered = await _rendered(backend, rendering, messages)
        name = backend.name
        held = self._held.get(name)
        opened, self.opened = self.opened, None  # the engine holds this request next
        if held is None and opened is not None:
            held = await _opened_held(backend, opened)
        anatomy = anatomy_of(messages, rendered, metrics, held, cache_grain_of(backend, metrics))
        after = held_after(anatomy, answer.content, metrics, rendered, answer.tokens)
        if after is None:
            self._held.pop(name, None)
        else:
            self._held[name] = after
        return rendered, anatomy


async def _rendered(
    backend: Backend,
    rendering: asyncio.Future[RenderedPrompt | None],
    messages: tuple[Message, ...],
) -> RenderedPrompt | None:
    """The prompt's rendering (None: the backend cannot say, or not in time)."""
    try:
        rendered = await asyncio.wait_for(rendering, RENDER_WAIT_S)
        if rendered is RENDER_AGAIN and backend.state == "ready":
            rendered = await asyncio.wait_for(backend.render(messages), RENDER_WAIT_S)
    except (TimeoutError, asyncio.CancelledError):
        rendered = None
    return None if rendered is RENDER_AGAIN else rendered


async def _opened_held(
    backend: Backend, opened: tuple[tuple[Message, ...], ChatMessage]
) -> Held | None:
    """What `backend`'s engine holds if it served the opened chat's last exchange
    (`opened`: its messages and answer), to be confirmed by its cached count."""
    messages, answer = opened
    if answer.backend != backend.name:
        return None
    try:
        rendered = await asyncio.wait_for(backend.render(messages), RENDER_WAIT_S)
    except TimeoutError:
        return None
    if rendered is None:
        return None
    return inferred_held(rendered, answer.content, answer.metrics)
