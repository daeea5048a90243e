"""Compare: the same conversation on two backends (or one backend with other settings),
measured the way `ask` and the chat measure an answer, and the difference between them.

A comparison is a side trip: it sends a copy of the messages and never touches a chat's
conversation, its trimmer or its saved record. Each answer is a fresh request through
the telemetry recorder, so its metrics are the same fields an answer in the chat has.

Rounds run A then B (interleaved, A B A B ...) when either backend answers one request at
a time (the local model) or both sides are the same backend; otherwise both sides of a
round may stream together. The figures of N rounds are summarized per metric by their
median and spread (min-max, or p10-p90 from 10 runs on), with the ratio B/A of the
medians; a metric whose spread is wider than the difference says so.
"""

from __future__ import annotations

import asyncio
import difflib
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from phasechat.backends.base import Backend
from phasechat.backends.events import GenerationRequest, Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import Exchange, TurnController
from phasechat.telemetry.metrics import Metrics, percentile
from phasechat.telemetry.recorder import Trace

#: The metrics compared, in order: (key, title, unit). `cache_reuse` is the share of the
#: prompt the engine found in its cache (cached / prompt tokens), 0-1.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("ttft_ms", "TTFT", "ms"),
    ("prefill_tok_s", "prefill", "tok/s"),
    ("decode_tok_s", "decode", "tok/s"),
    ("cache_reuse", "cache reuse", "%"),
    ("chars_per_s", "chars/s", "chars/s"),
    ("output_tokens", "output", "tok"),
    ("e2e_ms", "e2e", "ms"),
)

#: From this many runs on, the spread is p10-p90 (one outlier no longer sets it).
PERCENTILE_SPREAD_FROM = 10


def metric_value(metrics: Metrics, key: str) -> float | None:
    """One compared figure of an answer; None where it is unknown (never a made-up 0)."""
    if key == "cache_reuse":
        if metrics.cached_tokens is None or not metrics.prompt_tokens:
            return None
        return metrics.cached_tokens / metrics.prompt_tokens
    value = getattr(metrics, key)
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: a backend, the settings it answers with, and its label."""

    name: str  # the profile's name, with its overrides: "local", "local(threads=1)"
    backend: Backend
    settings: Settings
    #: this side's own messages (a prompt variant), else the comparison's
    messages: tuple[Message, ...] | None = None


@dataclass
class Answer:
    """One run on one side, readable while it streams."""

    side: int  # 0 = A, 1 = B
    round: int  # 0-based
    trace: Trace
    request: GenerationRequest
    metrics: Metrics | None = None
    started: bool = False
    #: the turn that runs it, on a controller of its own (none for a recorded answer)
    turn: tuple[TurnController, Exchange] | None = field(default=None, repr=False)

    @property
    def text(self) -> str:
        return self.trace.text

    @property
    def done(self) -> bool:
        return self.metrics is not None

    @property
    def complete(self) -> bool:
        """Finished without an error and not cancelled."""
        return self.done and self.trace.error is None and self.trace.finish != "cancelled"


def can_run_together(a: Backend, b: Backend) -> bool:
    """Whether two backends can stream at once without one queueing behind the other."""
    return a is not b and not a.serial and not b.serial


def cold_messages(messages: Sequence[Message], tag: str) -> tuple[Message, ...]:
    """`messages` with `[tag]` before the first one's text: no engine's prefix cache holds
    a prompt that starts so, so the whole prompt is read again (a cold prefill). The roles
    stay as they were (a template without a system role still accepts it)."""
    if not messages:
        return ()
    first = messages[0]
    return (Message(first.role, f"[{tag}]\n{first.content}"), *messages[1:])


def request_for(settings: Settings, messages: Sequence[Message]) -> GenerationRequest:
    """The request a side sends: the messages as given, with its own engine settings."""
    return GenerationRequest(
        messages=tuple(messages),
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        stop=settings.stop,
        seed=settings.seed,
    )


class Comparison:
    """Runs rounds of the same messages on sides A and B and keeps every answer."""

    def __init__(
        self,
        a: Side,
        b: Side,
        messages: Sequence[Message],
        *,
        together: bool = True,
        cold: bool = False,
    ) -> None:
        """`together`: stream both sides of a round at once where they can
        (`can_run_together`); `cold`: give each round its own first line, so no run finds
        the prompt cached (see `cold_messages`)."""
        self.sides = (a, b)
        self.messages = tuple(messages)
        self.together = together and can_run_together(a.backend, b.backend)
        self.cold = cold
        self.repeat = 0  # measured rounds run so far
        self.answers: list[Answer] = []

    def latest(self, side: int) -> Answer | None:
        """The newest answer of `side` (0 = A, 1 = B), streaming or done."""
        for answer in reversed(self.answers):
            if answer.side == side:
                return answer
        return None

    def of(self, side: int) -> list[Answer]:
        """Every finished answer of `side`, in order."""
        return [x for x in self.answers if x.side == side and x.done]

    def _answer(self, side: int, round_: int, messages: tuple[Message, ...]) -> Answer:
        """A new answer of `side`, not yet sent: a turn over the messages as they are, on
        a controller of its own (the chat's is never touched). Raises InputError (the
        template refused them)."""
        s = self.sides[side]
        # the messages as given, whatever their length
        turns = TurnController(s.backend, s.settings, name=s.name, trim=False)
        exchange = turns.ask_over(messages)
        assert exchange.request is not None
        return Answer(side, round_, exchange.trace, exchange.request, turn=(turns, exchange))

    async def _stream(self, answer: Answer) -> None:
        assert answer.turn is not None
        turns, exchange = answer.turn
        answer.started = True
        try:
            await turns.run(exchange)
        finally:
            answer.metrics = exchange.metrics

    async def run_round(self, round_: int, *, measured: bool = True) -> tuple[Answer, Answer]:
        """One round: A and B on the same messages (together, or A then B). Cold, both get
        the round's own first line (each its own when they share a backend). An unmeasured
        round (a warm-up) is not kept among the answers."""
        for_a, for_b = (s.messages or self.messages for s in self.sides)
        if self.cold:
            tag = secrets.token_hex(4)
            # one engine, one cache: with A's first line, B would find A's prompt
            shared = self.sides[0].backend is self.sides[1].backend
            for_a = cold_messages(for_a, tag)
            for_b = cold_messages(for_b, secrets.token_hex(4) if shared else tag)
        a, b = self._answer(0, round_, for_a), self._answer(1, round_, for_b)
        self.answers += (a, b)
        try:
            if self.together:
                await asyncio.gather(self._stream(a), self._stream(b))
            else:
                await self._stream(a)
                await self._stream(b)
        finally:
            for answer in (a, b):
                if answer.metrics is None and answer.turn is not None:
                    # B never started: the round was cancelled
                    turns, exchange = answer.turn
                    turns.abandon(exchange)
                    answer.metrics = exchange.metrics
            if not measured:
                self.answers.remove(a)
                self.answers.remove(b)
        return a, b

    async def run(
        self,
        repeat: int = 1,
        *,
        warm_up: bool = False,
        on_round: Callable[[Answer, Answer], None] | None = None,
    ) -> None:
        """`repeat` measured rounds (after one unmeasured round with `warm_up`, so every
        measured run finds the prompt in the engine's cache)."""
        if warm_up:
            await self.run_round(-1, measured=False)
        for n in range(repeat):
            a, b = await self.run_round(n)
            self.repeat += 1
            if on_round is not None:
                on_round(a, b)

    def rows(self) -> list[MetricRow]:
        """Each compared metric over the answers that completed (a failed or cancelled
        run's figures measure something else): A, B, ratio and difference."""
        a, b = ([x.metrics for x in self.of(n) if x.complete] for n in (0, 1))
        return compare_metrics([m for m in a if m], [m for m in b if m])


@dataclass(frozen=True, slots=True)
class Spread:
    """A metric's median and spread over the runs that measured it (unknowns left out).

    min-max below PERCENTILE_SPREAD_FROM runs: a comparison makes few runs (3 for "run
    each again"), and p10-p90 of three values lies inside their range, hiding the run
    that was far off; from that many on, one outlier no longer sets the spread. The
    sweep's spread over a level's repeats (telemetry/sweep_stats.RepeatSpread) is always
    p10-p90 for another reason: it decides when to stop repeating, and min-max never
    narrows."""

    n: int
    median: float | None
    lo: float | None
    hi: float | None
    kind: str  # "min-max" or "p10-p90"

    @property
    def width(self) -> float | None:
        return self.hi - self.lo if self.hi is not None and self.lo is not None else None


def spread_of(values: Sequence[float | None]) -> Spread:
    """Median and spread of the known values: min-max, or p10-p90 from
    PERCENTILE_SPREAD_FROM values on."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return Spread(0, None, None, None, "min-max")
    if len(known) >= PERCENTILE_SPREAD_FROM:
        lo, hi, kind = percentile(known, 10), percentile(known, 90), "p10-p90"
    else:
        lo, hi, kind = known[0], known[-1], "min-max"
    return Spread(len(known), percentile(known, 50), lo, hi, kind)


@dataclass(frozen=True, slots=True)
class MetricRow:
    """One metric of a comparison."""

    key: str
    title: str
    unit: str
    a: Spread
    b: Spread

    @property
    def ratio(self) -> float | None:
        """B / A of the medians (None: either unknown, or A is 0)."""
        a, b = self.a.median, self.b.median
        return b / a if a and b is not None else None

    @property
    def delta(self) -> float | None:
        """B - A of the medians."""
        a, b = self.a.median, self.b.median
        return b - a if a is not None and b is not None else None

    @property
    def noisy(self) -> bool:
        """Whether either side's spread is wider than the difference of the medians: the
        runs do not show which side is faster."""
        delta, widths = self.delta, [s.width for s in (self.a, self.b) if s.width is not None]
        return delta is not None and bool(widths) and max(widths) > abs(delta)

    def warning(self) -> str | None:
        """One line when `noisy`, else None."""
        if not self.noisy:
            return None
        assert self.delta is not None
        width = max(s.width for s in (self.a, self.b) if s.width is not None)
        kind = self.a.kind if self.a.width == width else self.b.kind
        return (
            f"{self.title}: the spread ({kind} {_num(width, self.unit)}) is wider than the "
            f"difference ({_num(abs(self.delta), self.unit)}): these runs do not tell A from B"
        )


def compare_metrics(a: Sequence[Metrics], b: Sequence[Metrics]) -> list[MetricRow]:
    """The compared metrics of two sets of answers (each side's runs, in order)."""
    rows = []
    for key, title, unit in METRICS:
        va = [metric_value(m, key) for m in a]
        vb = [metric_value(m, key) for m in b]
        rows.append(MetricRow(key, title, unit, spread_of(va), spread_of(vb)))
    return rows


def _num(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.0f}%"
    return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def fmt_cell(value: float | None, unit: str) -> str:
    """A figure as the tables show it; unknown is "n/a", never 0."""
    if value is None:
        return "n/a"
    if unit == "%":
        return f"{value * 100:.0f}%"
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def fmt_ratio(ratio: float | None) -> str:
    """B/A as the tables show it, in at most 7 characters: two decimals below 1,000,
    whole numbers with separators up to a million, a power of ten from there (a figure
    that far off is broken, and its digits say nothing); below 0.01, "<0.01"."""
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    size = abs(ratio)
    if size >= 999_999.5:
        return f"{ratio:.1e}"
    if size >= 999.995:
        return f"{ratio:,.0f}"
    if 0 < size < 0.005:
        return "<0.01"
    return f"{ratio:.2f}"


def aligned(rows: Sequence[Sequence[str]], widths: Sequence[int], gap: int = 2) -> list[str]:
    """Rows of cells as lines of a table: the first column left-aligned, the others
    right-aligned. Each column is `widths` wide, or wider where a cell needs it, so that
    `gap` spaces always part it from its neighbour (a fixed width let a long figure run
    into the next column)."""
    fitted = [
        max(width, gap + max((len(row[i]) for row in rows), default=0))
        for i, width in enumerate(widths)
    ]
    return [
        row[0].ljust(fitted[0])
        + "".join(c.rjust(w) for c, w in zip(row[1:], fitted[1:], strict=True))
        for row in rows
    ]


def fmt_spread(s: Spread, unit: str) -> str:
    """ "median [lo-hi]" (just the median for one run)."""
    if s.median is None:
        return "n/a"
    if s.n < 2 or s.lo is None or s.hi is None:
        return fmt_cell(s.median, unit)
    return f"{fmt_cell(s.median, unit)} [{fmt_cell(s.lo, unit)}-{fmt_cell(s.hi, unit)}]"


def word_diff(a: str, b: str) -> str:
    """B's answer against A's, word by word: `[-A's words-]{+B's words+}` where they
    differ, the words in common as they are (wdiff's notation)."""
    wa, wb = a.split(), b.split()
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=wa, b=wb, autojunk=False).get_opcodes():
        if op == "equal":
            out += wa[i1:i2]
            continue
        if i2 > i1:
            out.append("[-" + " ".join(wa[i1:i2]) + "-]")
        if j2 > j1:
            out.append("{+" + " ".join(wb[j1:j2]) + "+}")
    return " ".join(out)


def greedy(c: Comparison) -> bool:
    """Both sides decode deterministically (temperature 0, a seed): their answers differ
    only where their prompts or engines make them."""
    return all(s.settings.temperature == 0 and s.settings.seed is not None for s in c.sides)
