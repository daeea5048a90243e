"""A turn's prompt anatomy (telemetry/anatomy.py): the request's messages as parts, the
engine's rendering of them, the answer's counts and times, and what the engine held
before this request (the previous one on the same backend: its prompt and answer).

The rendering is asked of the backend when the request starts (the local model's
tokenizer on its own thread, llama-server's /apply-template and /tokenize), so the panel
can name the section a long prefill is reading; the sections' cached and read counts
follow from the engine's own count once it is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import Message
from phasechat.backends.tokens import estimate_once
from phasechat.chat.trim.types import SUMMARY_HEADER
from phasechat.telemetry.anatomy import (
    Anatomy,
    Part,
    find_break,
    locate,
    split_estimated,
    split_exact,
)
from phasechat.telemetry.metrics import Metrics

#: What an estimated prompt's text is made of: the parts, one per line (no template).
_JOIN = "\n"


@dataclass(frozen=True, slots=True)
class Held:
    """What an engine held after a request: its prompt's text (templated where known)
    then the answer, and how many tokens that was."""

    text: str
    tokens: int | None


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
) -> Anatomy | None:
    """The sections of a finished request (None: its prompt count is unknown, a request
    refused before it was read), with the cache break against `held` if there was one."""
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
    again = held.tokens - cached if held.tokens is not None and cached is not None else None
    brk = find_break(
        held.text,
        anatomy.text,
        anatomy.spans,
        anatomy.sections,
        again,
        estimated=anatomy.source == "estimate",
    )
    return Anatomy(
        anatomy.sections,
        anatomy.source,
        brk,
        anatomy.text,
        anatomy.spans,
        anatomy.cached_chars,
    )


def held_after(anatomy: Anatomy | None, answer: str, metrics: Metrics) -> Held | None:
    """What the engine holds once this answer is done: the prompt, then the answer."""
    if anatomy is None or not anatomy.text:
        return None
    tokens = None
    if metrics.prompt_tokens is not None:
        tokens = metrics.prompt_tokens + metrics.output_tokens
    joiner = "" if anatomy.source != "estimate" else _JOIN
    return Held(anatomy.text + joiner + answer, tokens)


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
