"""Ablation: what each part of a prompt is worth. A chat's last turn is run again with
each section removed in turn (the system prompt, the trimmer's summary, each earlier
exchange: a question and its answer together, so the roles still alternate for strict
templates), beside the full prompt, and the differences reported.

Every run is cold (its own first line, as compare's cold rounds: `cold_messages`), so
each variant pays its own prefill; rounds interleave the variants (full, cut 1, cut 2,
..., then again), so a machine whose speed drifts moves them all alike. A side trip:
each run is a turn on a controller of its own; the chat is never touched. The engine's
cache then holds the last variant, not the chat: the next turn of the chat pays a cold
prefill (the caller says so).

A section's tokens are the full prompt's sections (telemetry/anatomy.py; an exchange is
its question's and its answer's), so the rows and the kept rest (the new question and
the template) add up to the prompt.
"""

from __future__ import annotations

import functools
import secrets
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.engine_held import anatomy_of
from phasechat.chat.text import one_line
from phasechat.chat.trim.summarize import SUMMARY_HEADER
from phasechat.chat.trips.compare import cold_messages
from phasechat.chat.turns import TurnController
from phasechat.telemetry.anatomy import Anatomy
from phasechat.telemetry.forecast import Rates, forecast
from phasechat.telemetry.metrics import Metrics

#: more runs than this are asked about first (on a terminal, in the UI; `ablate` with no
#: terminal refuses them without --yes or --max-runs): a 4-turn chat at --repeat 3 is 15
ASK_ABOVE_RUNS = 30
#: an estimate longer than this is asked about too, however few the runs
ASK_ABOVE_MS = 10 * 60 * 1000.0


@dataclass(frozen=True, slots=True)
class Cut:
    """One section of the prompt, and the prompt without it."""

    name: str  # "system prompt", "summary", "exchange 2" (question 2 and its answer)
    kind: str  # "system", "summary", "exchange"
    #: the request's indices of its messages (0: the system message)
    message_indices: tuple[int, ...]
    messages: tuple[Message, ...]


def cuts_of(messages: Sequence[Message]) -> list[Cut]:
    """Each section that can be removed from a request, with the request without it."""
    messages = tuple(messages)
    out: list[Cut] = []
    first = messages[0] if messages else None
    if first is not None and first.role == "system":
        rest = messages[1:]
        system, header, summary = first.content.partition(SUMMARY_HEADER)
        system = system.removesuffix("\n\n") if header else first.content
        if system and header:
            out.append(
                Cut("system prompt", "system", (0,), (Message("system", header + summary), *rest))
            )
            out.append(Cut("summary", "summary", (0,), (Message("system", system), *rest)))
        elif header:
            out.append(Cut("summary", "summary", (0,), rest))
        elif system:
            out.append(Cut("system prompt", "system", (0,), rest))
    start = 1 if first is not None and first.role == "system" else 0
    last = len(messages) - 1
    number = 0
    for i in range(start, last - 1):
        if messages[i].role == "user" and messages[i + 1].role == "assistant":
            number += 1
            without = (*messages[:i], *messages[i + 2 :])
            out.append(Cut(f"exchange {number}", "exchange", (i, i + 1), without))
    return out


def section_tokens(anatomy: Anatomy, cut: Cut) -> int:
    """The tokens of `cut` in the full prompt's sections (its messages' own text)."""
    kinds = {"system": ("system",), "summary": ("summary",), "exchange": ("history",)}[cut.kind]
    return sum(
        s.tokens
        for s in anatomy.sections
        if s.kind in kinds and s.message_index in cut.message_indices
    )


def words_in_common(a: str, b: str) -> float:
    """The share of words two answers have in common (multisets; 1.0: the same words)."""
    wa, wb = Counter(a.split()), Counter(b.split())
    most = max(sum(wa.values()), sum(wb.values()))
    return sum((wa & wb).values()) / most if most else 1.0


@dataclass
class Variant:
    """The full prompt, or the prompt without one section, and its runs."""

    cut: Cut | None  # None: the full prompt
    messages: tuple[Message, ...]
    runs: list[tuple[Metrics, str]] = field(default_factory=list)  # (metrics, answer)

    def median(self, key: Callable[[Metrics], float | None]) -> float | None:
        values = [v for m, _ in self.runs if (v := key(m)) is not None]
        return statistics.median(values) if values else None


def _prefill_ms(m: Metrics) -> float | None:
    return m.server_prompt_ms if m.server_prompt_ms is not None else m.ttft_ms


def _decode_ms(m: Metrics) -> float | None:
    if m.e2e_ms is None or m.ttft_ms is None:
        return None
    return m.e2e_ms - m.ttft_ms


#: The figures compared: (key in the report, how it is read from an answer's metrics)
FIGURES: tuple[tuple[str, Callable[[Metrics], float | None]], ...] = (
    ("ttft_ms", lambda m: m.ttft_ms),
    ("prefill_ms", _prefill_ms),
    ("output_tokens", lambda m: float(m.output_tokens)),
    ("decode_ms", _decode_ms),
    ("e2e_ms", lambda m: m.e2e_ms),
)


@dataclass(frozen=True, slots=True)
class Row:
    """One section: its tokens and what removing it changed (cut minus full, medians)."""

    section: str
    kind: str
    message_indices: tuple[int, ...]
    tokens: int | None
    deltas: dict[str, float | None]
    #: the answers without it: identical to the full prompt's (at temperature 0), else None
    answer_identical: bool | None
    #: the share of words in common with the full prompt's answer (first runs)
    words_in_common: float | None

    def as_dict(self) -> dict[str, object]:
        return {
            "section": self.section,
            "kind": self.kind,
            "message_indices": list(self.message_indices),
            "tokens": self.tokens,
            **{f"{k}_delta": v for k, v in self.deltas.items()},
            "answer_identical": self.answer_identical,
            "words_in_common": self.words_in_common,
        }


class Ablation:
    """Runs the full prompt and each cut, `repeat` cold rounds, interleaved."""

    def __init__(self, backend: Backend, settings: Settings, messages: Sequence[Message]) -> None:
        self.backend, self.settings = backend, settings
        self.full = Variant(None, tuple(messages))
        self.variants = [self.full] + [Variant(c, c.messages) for c in cuts_of(messages)]
        self.anatomy: Anatomy | None = None  # the full prompt's sections (its first run)

    def runs(self, repeat: int) -> int:
        """How many answers `run(repeat)` asks for: every variant, `repeat` times."""
        return len(self.variants) * repeat

    def estimate_ms(self, repeat: int, rates: Rates) -> float | None:
        """How long `run(repeat)` should take at `rates`: each run cold (a prefill of its
        whole prompt) and up to max_tokens of answer; None while the backend's speeds are
        not measured. The full prompt is counted by the backend (an estimate before a
        model is loaded), each variant as the full prompt less the messages it cuts (and
        plus a system message it keeps a part of): a 5,000-turn chat's 5,001 prompts are
        not each counted whole."""
        count = self.backend.count_tokens(self.full.messages)
        one = functools.cache(lambda m: self.backend.count_tokens((m,)).tokens)
        total = 0.0
        for variant in self.variants:
            tokens = count.tokens
            cut = variant.cut
            if cut is not None:
                tokens -= sum(one(self.full.messages[i]) for i in cut.message_indices)
                first = variant.messages[0] if variant.messages else None
                if 0 in cut.message_indices and first is not None and first.role == "system":
                    tokens += one(first)  # the summary without the prompt, or the reverse
            limit = self.settings.max_tokens
            predicted = forecast(rates, max(1, tokens), 0, limit, count.estimated).total_ms
            if predicted is None:
                return None
            total += predicted
        return total * repeat

    async def run(
        self, repeat: int, on_run: Callable[[Variant, Metrics], None] | None = None
    ) -> None:
        for _ in range(repeat):
            for variant in self.variants:
                # the messages as given
                name = self.backend.name
                turns = TurnController(self.backend, self.settings, name=name, trim=False)
                exchange = turns.ask_over(cold_messages(variant.messages, secrets.token_hex(4)))
                await turns.run(exchange)
                metrics = exchange.metrics
                assert metrics is not None
                if metrics.finish in ("error", "cancelled"):
                    raise RuntimeError(exchange.answer.error or f"a run ended {metrics.finish}")
                variant.runs.append((metrics, exchange.answer.content))
                if variant is self.full and self.anatomy is None:
                    self.anatomy = await self._sections(metrics)
                if on_run is not None:
                    on_run(variant, metrics)

    async def _sections(self, metrics: Metrics) -> Anatomy | None:
        """The full prompt's sections as the chat sends it (without a cold run's first
        line): exact where the backend renders prompts, else estimated over the count."""
        messages = self.full.messages
        rendered = await self.backend.render(messages)
        total = len(rendered.pieces) if rendered is not None else metrics.prompt_tokens
        counted = replace(
            metrics, tokens=replace(metrics.tokens, prompt_tokens=total, cache_reported=False)
        )
        return anatomy_of(messages, rendered, counted, None)

    @property
    def prompt_tokens(self) -> int | None:
        return self.anatomy.prompt_tokens if self.anatomy is not None else None

    def rows(self) -> list[Row]:
        """One row per section, the one whose removal saved the most end-to-end first."""
        full_answer = self.full.runs[0][1] if self.full.runs else ""
        greedy = self.settings.temperature == 0
        out = []
        for v in self.variants[1:]:
            assert v.cut is not None
            deltas: dict[str, float | None] = {}
            for key, read in FIGURES:
                cut, whole = v.median(read), self.full.median(read)
                deltas[key] = cut - whole if cut is not None and whole is not None else None
            answer = v.runs[0][1] if v.runs else ""
            same = answer == full_answer
            out.append(
                Row(
                    v.cut.name,
                    v.cut.kind,
                    v.cut.message_indices,
                    section_tokens(self.anatomy, v.cut) if self.anatomy else None,
                    deltas,
                    same if greedy else None,
                    words_in_common(answer, full_answer),
                )
            )
        out.sort(key=lambda r: r.deltas["e2e_ms"] if r.deltas["e2e_ms"] is not None else 0.0)
        return out

    def kept_tokens(self) -> int | None:
        """The prompt's tokens no row removes: the new question and the template's own."""
        if self.anatomy is None:
            return None
        return sum(s.tokens for s in self.anatomy.sections if s.kind in ("new", "template"))


UNITS = {"output_tokens": "tok"}
TITLES = {
    "ttft_ms": "TTFT",
    "prefill_ms": "prefill",
    "output_tokens": "output",
    "decode_ms": "decode",
    "e2e_ms": "e2e",
}
#: What a user is told after an ablation: it is a side trip, but the engine's cache moved.
CACHE_AFTER = "the engine's cache now holds the last variant: the chat's next turn reads cold"


def _delta(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    unit = UNITS.get(key, "ms")
    return f"{value:+,.1f} {unit}" if unit == "ms" else f"{value:+,.1f}"


def _answer(row: Row) -> str:
    if row.answer_identical:
        return "same answer"
    share = row.words_in_common
    return "changed" + (f" ({share:.0%} words in common)" if share is not None else "")


def ablation_title(ablation: Ablation, repeat: int) -> str:
    backend = ablation.backend
    approx = "~" if ablation.anatomy is not None and ablation.anatomy.source == "estimate" else ""
    tokens = ablation.prompt_tokens
    prompt = f"prompt {approx}{tokens} tokens" if tokens is not None else "prompt not counted yet"
    return (
        f"{one_line(backend.name)} ({one_line(backend.model)}), {repeat} cold runs of each "
        f"variant, medians; {prompt}"
    )


def report_lines(ablation: Ablation) -> list[str]:
    """The table: one line per section (what removing it changed), then what every
    variant keeps, the full prompt's figures and the cache's state."""
    approx = "~" if ablation.anatomy is not None and ablation.anatomy.source == "estimate" else ""
    head = f"{'without':<16}{'tokens':>8}" + "".join(f"{TITLES[k] + ' Δ':>14}" for k, _ in FIGURES)
    lines = [head + "  answer"]
    for row in ablation.rows():
        tokens = "-" if row.tokens is None else f"{approx}{row.tokens:,}"
        cells = "".join(f"{_delta(row.deltas[k], k):>14}" for k, _ in FIGURES)
        lines.append(f"{one_line(row.section):<16}{tokens:>8}{cells}  {_answer(row)}")
    lines.append(
        f"kept in every variant: the question and the template, {approx}{ablation.kept_tokens()} "
        "tokens"
    )
    full = [(k, ablation.full.median(read)) for k, read in FIGURES]
    shown = (f"{TITLES[k]} {v:,.1f} {UNITS.get(k, 'ms')}" for k, v in full if v is not None)
    lines.append("the full prompt: " + ", ".join(shown))
    lines.append(CACHE_AFTER)
    return lines


def plan_line(ablation: Ablation, repeat: int, estimate_ms: float | None) -> str:
    """What is about to run: `ablate: 603 cold runs (201 prompts x --repeat 3), about 2 h
    at this backend's speeds in this chat (answers of up to 512 tokens)`."""
    head = (
        f"ablate: {ablation.runs(repeat):,} cold runs "
        f"({len(ablation.variants):,} prompts x --repeat {repeat})"
    )
    if estimate_ms is None:
        return f"{head}, time unknown: this backend's speeds are not measured in this chat"
    limit = ablation.settings.max_tokens
    return (
        f"{head}, about {duration(estimate_ms)} at this backend's speeds in this chat "
        f"(answers of up to {limit:,} tokens)"
    )


def is_long(runs: int, estimate_ms: float | None) -> bool:
    """Whether a job of `runs` runs (about `estimate_ms`) is asked about before it starts."""
    return runs > ASK_ABOVE_RUNS or (estimate_ms is not None and estimate_ms > ASK_ABOVE_MS)


def duration(ms: float) -> str:
    """`ms` as a person says it: "40 s", "12 min", "2 h 5 min"."""
    s = round(ms / 1000)
    if s < 60:
        return f"{s} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
