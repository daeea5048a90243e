"""Writing a history summary: the request to the summarizer, the summary it writes (one
record, and the system message that carries it), and what to do when what comes back
cannot be used (empty, cut at its limit, or a model stuck repeating itself, as
SmolLM2-135M often is): the first sentence of each summarized turn instead."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from phasechat.backends.base import Backend
from phasechat.backends.events import GenerationRequest, Message
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.telemetry.recorder import Trace, record

SUMMARY_HEADER = "Summary of the earlier conversation:\n"
INSTRUCTION = (
    "Summarize the conversation so far in at most {words} words, as notes for yourself. "
    "Keep names, numbers, facts, decisions and open questions. Write only the summary."
)


@dataclass(frozen=True, slots=True)
class Summary:
    """One summary: its text, the messages it stands for, and what it cost to write."""

    text: str
    covers: frozenset[int]  # ids of the ChatMessages it replaces (earlier summaries' too)
    backend: str
    model: str
    metrics: Metrics  # the summary request's own TTFT, e2e and token counts
    started_ns: int = 0  # perf_counter_ns when its request was sent
    finished_ns: int = 0  # ... and when its last event arrived
    #: "model": written by the summarizer; "extractive": the first sentence of each
    #: summarized turn, because the model's summary was unusable (`why`)
    kind: Literal["model", "extractive"] = "model"
    why: str | None = None

    def system(self, system: str) -> Message:
        """The one system message with the summary appended after the user's own system
        prompt, which stays byte-identical, so the prefix up to it still hits the cache.
        Every chat template accepts one system message first; a second one, or one in
        the middle, breaks strict templates (Gemma, Mistral)."""
        head = f"{system}\n\n" if system else ""
        return Message("system", head + SUMMARY_HEADER + self.text)


#: Characters per token for sizing an extractive summary (English prose, roughly).
CHARS_PER_TOKEN = 4


def fit(
    count: Callable[[Sequence[Message]], int], messages: list[Message], first: int, room: int
) -> tuple[Message, ...]:
    """Shorten the longest turns to be summarized (from index `first`; the last message
    is the instruction) until the request's `count` fits `room` tokens: only when the
    summarizer's window is smaller than the chat's, or the budget was set above it."""
    for _ in range(32):
        if count(messages) <= room:
            break
        i = max(range(first, len(messages) - 1), key=lambda k: len(messages[k].content))
        text = messages[i].content
        if len(text) < 64:
            break
        keep = len(text) // 4
        messages[i] = Message(messages[i].role, f"{text[:keep]} [...] {text[-keep:]}")
    return tuple(messages)


async def write_summary(
    backend: Backend,
    request: GenerationRequest,
    covers: frozenset[int],
    turns: Sequence[Message],
    earlier: str = "",
) -> tuple[Summary | None, str | None]:
    """Run the summary request: (the summary, None), or (None, why it failed). A summary
    that came back unusable is replaced by an extractive one made from `turns`, after
    the lines of the `earlier` summary it extends."""
    trace = Trace(backend=backend.name, model=backend.model, max_tokens=request.max_tokens)
    try:
        async for _ in record(backend.stream(request), trace):
            pass
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a summarizer bug must not break the chat
        return None, f"{type(exc).__name__}: {exc}"
    if trace.error is not None:
        return None, trace.error.message
    text = trace.text.strip()
    why = unusable(text, trace.finish)
    if why is not None:  # the first sentence of each turn, within the same size
        text = extractive(turns, request.max_tokens * CHARS_PER_TOKEN, earlier)
    summary = Summary(
        text,
        covers,
        trace.backend,
        trace.model,
        compute(trace),
        started_ns=trace.t_sent,
        finished_ns=trace.t_done or time.perf_counter_ns(),
        kind="extractive" if why else "model",
        why=why,
    )
    return summary, None


#: A summary whose 4-word phrases are this repetitive is a model stuck in a loop.
REPEAT_SHARE = 0.6


def unusable(text: str, finish: str | None) -> str | None:
    """Why a model-written summary cannot be used as it is (None: it can)."""
    if not text.strip():
        return "the model's summary was empty"
    if finish == "length":
        return "the model's summary ran past its length limit"
    words = text.lower().split()
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    if len(grams) >= 8 and len(set(grams)) / len(grams) < REPEAT_SHARE:
        return "the model's summary repeated itself"
    return None


def first_sentence(text: str, max_chars: int = 240) -> str:
    """The first sentence of `text`, on one line, at most `max_chars`."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    sentence = match.group(1) if match else flat
    return sentence if len(sentence) <= max_chars else sentence[: max_chars - 1] + "…"


def extractive(turns: Sequence[Message], max_chars: int, earlier: str = "") -> str:
    """The first sentence of each summarized turn, oldest first, after the lines of the
    `earlier` summary it extends, within `max_chars` (the newest lines are kept when they
    do not all fit)."""
    lines = [line for line in earlier.splitlines() if line.strip()]
    lines += [f"- {m.role}: {first_sentence(m.content)}" for m in turns if m.content.strip()]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) + 1 > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(reversed(kept))
