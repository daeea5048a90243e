"""A remote answer's wait for its first token, as a waterfall: what each part of the TTFT
was, measured here or said by the server, and the part nobody explains.

In order, from the request's send (ms):
- `connect`: opening the connection, TCP and TLS (0 on a kept-alive one; httpx's trace);
- `request sent`: writing the request until its body was all out (httpx's trace);
- `model load`: the server's wait for the model to load before it read the prompt
  (its own figure: Ollama's `load_duration`);
- `queued`: waiting at the server before its prefill began (the server's own figure);
- `prefill`: the server's prefill (its own figure);
  a server that defines these two otherwise has them shown under its own names, with its
  own definitions (`PartMeaning`: Dynamo's "frontend: tokenize + route" and "worker:
  queue + prefill"), so that no part is called what the server did not measure;
- `server, other`: the rest of the server's own time to first token (tokenizing,
  scheduling), where it says that whole as well as its parts;
- `the rest`: the TTFT less all of the above: the first bytes' way back, and whatever
  neither side accounts for.

A part under a nanosecond (`NOISE_MS`: finer than either clock reads) is float noise
from subtracting the server's figures: it is zero, and a server part of zero left over is
no part. Every server figure is held against the client's clock: the server had at most the
time from the connection's opening to its first token here (the body's "all written"
stamp is taken after the write returns, and on a busy client it can trail the server's
receipt: where the server's parts need the room, "request sent" is what is left). A part
(or the parts together) longer than that is a contradiction, named, and every server part
is then unknown:
which clock is wrong, neither can say. Pure: numbers in, a `Waterfall` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phasechat.backends.events import PartMeaning
from phasechat.backends.remote.server_metrics import beyond
from phasechat.telemetry.metric_set import Metrics, ServerFigures, TimingFigures

CONNECT, SENT, LOAD, QUEUED, PREFILL, OTHER, REST = (
    "connect",
    "request sent",
    "model load",
    "queued",
    "prefill",
    "server, other",
    "the rest",
)
#: A part that takes at least this share of the TTFT dominates it.
DOMINANT_SHARE = 0.5
#: Less than a nanosecond: no clock here or at a server resolves it, so a difference of
#: figures that small is the floats' rounding (Dynamo's ttft_ms less its two parts gave
#: 3.6e-15 ms), not time anyone spent.
NOISE_MS = 1e-6


@dataclass(frozen=True, slots=True)
class Step:
    """One part of the wait: its name (one of the six above), its time (ms; None:
    unknown) and who said it; `label` and `means`: the server's own name for it and its
    definition, where the server defines the part otherwise (None: the name says it)."""

    name: str
    ms: float | None
    source: str
    label: str | None = None
    means: str | None = None

    @property
    def shown(self) -> str:
        """The name the part is shown under: the server's own, else ours."""
        return self.label or self.name


@dataclass(frozen=True, slots=True)
class Waterfall:
    """The parts of one TTFT, in order; `contradiction` says why the server's are
    unknown (None: they fit); `headers_ms`: when the response's headers arrived."""

    ttft_ms: float
    steps: tuple[Step, ...]
    headers_ms: float | None = None
    contradiction: str | None = None

    def ms(self, name: str) -> float | None:
        """The time of part `name` (None: unknown or not there)."""
        return next((s.ms for s in self.steps if s.name == name), None)

    def dominant(self) -> Step | None:
        """The part that took at least half the TTFT, if one did."""
        if self.ttft_ms <= 0:
            return None
        known = [s for s in self.steps if s.ms is not None]
        top = max(known, key=lambda s: s.ms or 0.0, default=None)
        return top if top is not None and (top.ms or 0) / self.ttft_ms >= DOMINANT_SHARE else None

    def line(self) -> str:
        """`TTFT 250 ms = connect 1 · request sent 0 · queued 40 · prefill 120 · the rest 89`"""
        parts = " · ".join(
            f"{s.shown} {'?' if s.ms is None else f'{s.ms:,.0f}'}" for s in self.steps
        )
        return f"TTFT {self.ttft_ms:,.0f} ms = {parts} ms"

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict: each part's ms and source (and the server's own name and
        definition of it, where it has them), and the contradiction."""
        return {
            "ttft_ms": self.ttft_ms,
            "steps": [
                {"name": s.name, "ms": s.ms, "source": s.source}
                | ({"label": s.label, "means": s.means} if s.label is not None else {})
                for s in self.steps
            ],
            "headers_ms": self.headers_ms,
            "contradiction": self.contradiction,
        }


def waterfall(timing: TimingFigures, server: ServerFigures) -> Waterfall | None:
    """The waterfall of an answer's TTFT (None: it had no first token), from its records
    as the metric set holds them: the connection and the body's send (`sent_ms`, from
    the send) measured here; the queue, the prefill (`server_prompt_ms`), the server's
    own time to first token and its wait for the model to load as the server
    (`server_source`) said them, under its own names for its parts where it has them."""
    ttft_ms = timing.ttft_ms
    if ttft_ms is None or ttft_ms <= 0:
        return None
    here = "measured here"
    source = server.server_source or "the server"
    meanings = _meanings(server)
    connect, sent_ms = timing.connect_ms, timing.sent_ms
    sent = _zeroed(max(0.0, sent_ms - (connect or 0.0))) if sent_ms is not None else None
    budget = max(0.0, ttft_ms - (connect or 0.0))  # the most time the server can have had
    steps = [Step(CONNECT, connect, here), Step(SENT, sent, here)]
    parts = {QUEUED: server.server_queue_ms, PREFILL: server.server_prompt_ms}
    if server.server_load_ms is not None:
        parts = {LOAD: server.server_load_ms, **parts}
    server_ttft_ms = server.server_ttft_ms
    headers_ms = timing.headers_ms
    said = [v for v in (*parts.values(), server_ttft_ms) if v is not None]
    if not said:
        rest = max(0.0, budget - (sent or 0.0))
        return Waterfall(ttft_ms, (*steps, Step(REST, rest, here)), headers_ms)
    shown = {n: meanings[n].name if n in meanings else n for n in parts}
    claims = [
        f"{shown[n]} {v:,.0f} ms" for n, v in parts.items() if v is not None and beyond(v, budget)
    ]
    if server_ttft_ms is not None and beyond(server_ttft_ms, budget):
        claims.append(f"time to first token {server_ttft_ms:,.0f} ms")
    both = [v for v in parts.values() if v is not None]
    if not claims and len(both) >= 2 and beyond(sum(both), budget):
        named = " + ".join(shown[n] for n, v in parts.items() if v is not None)
        claims.append(f"{named} {sum(both):,.0f} ms")
    if claims:
        why = (
            f"contradiction: {source} says {', '.join(claims)}, longer than the "
            f"{budget:,.0f} ms from the request's send to its first token measured here: "
            "its figures are unknown"
        )
        unknown = [_said(n, None, source, meanings) for n in parts]
        return Waterfall(ttft_ms, (*steps, *unknown, Step(REST, None, here)), headers_ms, why)
    own = sum(both)
    other = None
    if server_ttft_ms is not None and _zeroed(server_ttft_ms - own) > 0:
        other, own = server_ttft_ms - own, server_ttft_ms
    if sent is not None and sent > budget - own:  # the stamp trailed the server's receipt
        steps[1] = Step(SENT, _zeroed(max(0.0, budget - own)), here)
    steps += [_said(n, v, source, meanings) for n, v in parts.items() if v is not None]
    if other is not None:
        steps.append(Step(OTHER, other, source))
    steps.append(Step(REST, _zeroed(max(0.0, budget - own - (steps[1].ms or 0.0))), here))
    return Waterfall(ttft_ms, tuple(steps), headers_ms)


def _meanings(server: ServerFigures) -> dict[str, PartMeaning]:
    """The server's own names and definitions of its queue and prefill, where it has them."""
    return {
        part: PartMeaning(name, means or "")
        for part, name, means in (
            (QUEUED, server.server_queue_name, server.server_queue_means),
            (PREFILL, server.server_prefill_name, server.server_prefill_means),
        )
        if name is not None
    }


def _said(name: str, ms: float | None, source: str, meanings: Mapping[str, PartMeaning]) -> Step:
    """A part the server said, under its own name and definition where it has them."""
    meaning = meanings.get(name)
    if meaning is None:
        return Step(name, ms, source)
    return Step(name, ms, source, meaning.name, meaning.means)


def _zeroed(ms: float) -> float:
    """`ms`, or 0 where it is float noise (`NOISE_MS`)."""
    return 0.0 if abs(ms) < NOISE_MS else ms


def waterfall_of(m: Metrics) -> Waterfall | None:
    """A remote answer's waterfall from its metrics (None: a local answer, one whose
    response had no headers, or one without a first token)."""
    return waterfall(m.timing, m.server) if m.headers_ms is not None else None
