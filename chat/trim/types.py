"""What the history trimmer decides and reports, as plain data: a summary, the plan for
one send, what it is told after one, and the panel's figures."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.chat.conversation import Conversation
from phasechat.telemetry.metrics import Metrics

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


@dataclass(frozen=True, slots=True)
class SendPlan:
    """How one send relates to the trimmer; copied onto the exchange for the UI.

    `trimmed`: this send is the first with a new summary (its prefix cache starts over
    after the system prompt). `wait`: the send must wait for the summary in flight.
    `note`: one line for the user when the trimmer did something unexpected.
    """

    trimmed: bool = False
    wait: bool = False
    note: str | None = None
    waited_ms: float | None = None
    serial: bool = False  # the summary runs on the chat's own local model, one at a time
    # What `Trimmer.plan` adds for the controller (the rest of a send, decided once):
    #: the messages to send (system, the summary in use, the turns it does not cover)
    messages: tuple[Message, ...] = ()
    #: our own count of them, and whether it is the model's tokenizer's (not an estimate)
    prompt_tokens: int | None = None
    exact: bool = False
    #: the window to measure against, and who said so
    window: int | None = None
    window_source: str | None = None
    #: prompt tokens the summary cut from this send (0 when it waits, or is sent again)
    tokens_cut: int = 0
    #: `wait`: await it for the plan to send once the summary in flight is written
    ready: Callable[[], Awaitable[SendPlan]] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Shown:
    """The chat shows another branch (an edit, a sibling, another chat)."""

    conversation: Conversation


@dataclass(frozen=True, slots=True)
class Answered:
    """An answer finished (not failed) on `backend`: the history grew."""

    backend: Backend
    conversation: Conversation
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The server refused the prompt as longer than its window (`n_ctx`, where it named
    one): trim to fit and send once more."""

    backend: Backend
    conversation: Conversation
    max_tokens: int
    n_ctx: int | None


#: What the controller tells the trimmer (`Trimmer.tell`).
News = Shown | Answered | Refused


@dataclass(frozen=True, slots=True)
class TrimStats:
    """What the telemetry panel shows about trimming."""

    enabled: bool
    budget: int
    estimated: bool  # token counts are tiktoken estimates, not the model's tokenizer
    summaries: int
    summarized_messages: int
    pending: bool
    tokens_cut: int  # the last prompt: full history minus what was sent
    tokens_cut_total: int  # summed over every send
    prefill_tok_s: float | None  # measured on this session's own answers
    prefill_s_saved: float | None  # tokens_cut_total / prefill_tok_s, as a cold prefill
    summary_ttft_ms: float | None  # the latest summary's own cost
    summary_e2e_ms: float | None
    summary_tokens: int | None
    summary_ms_total: float  # every summary's e2e, summed
    last_error: str | None
    summary_kind: str | None = None  # the one in use: "model" or "extractive"
    summary_why: str | None = None  # why the model's was not used


def measured_prefill_rate(answers: Sequence[Metrics | None]) -> float | None:
    """Evaluated prompt tokens per second over answers whose prefill was long enough to
    measure (a handful of tokens is dominated by fixed per-request overhead)."""
    tokens = seconds = 0.0
    for m in answers:
        ttft = m.ttft_ready_ms if m else None  # a wait for the model to load is not prefill
        if m and m.evaluated_prompt_tokens and ttft and m.evaluated_prompt_tokens >= 32:
            tokens += m.evaluated_prompt_tokens
            seconds += ttft / 1000
    return tokens / seconds if seconds else None
