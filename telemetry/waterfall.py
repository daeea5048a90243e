"""A remote answer's wait for its first token, as a waterfall: what each part of the TTFT
was, measured here or said by the server, and the part nobody explains.

In order, from the request's send (ms):
- `connect`: opening the connection, TCP and TLS (0 on a kept-alive one; httpx's trace);
- `request sent`: writing the request until its body was all out (httpx's trace);
- `model load`: the server's wait for the model to load before it read the prompt
  (its own figure: Ollama's `load_duration`);
- `queued`: waiting at the server before its prefill began (the server's own figure);
- `prefill`: the server's prefill (its own figure);
- `server, other`: the rest of the server's own time to first token (tokenizing,
  scheduling), where it says that whole as well as its parts;
- `the rest`: the TTFT less all of the above: the first bytes' way back, and whatever
  neither side accounts for.

Every server figure is held against the client's clock: the server had at most the
time from the request's send to its first token here. A part (or the parts together)
longer than that is a contradiction, named, and every server part is then unknown:
which clock is wrong, neither can say. Pure: numbers in, a `Waterfall` out.
"""

from __future__ import annotations

from dataclasses import dataclass

from phasechat.backends.server_metrics import beyond
from phasechat.telemetry.metrics import Metrics

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


@dataclass(frozen=True, slots=True)
class Step:
    """One part of the wait: its name, its time (ms; None: unknown) and who said it."""

    name: str
    ms: float | None
    source: str


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
            f"{s.name} {'?' if s.ms is None else f'{s.ms:,.0f}'}" for s in self.steps
        )
        return f"TTFT {self.ttft_ms:,.0f} ms = {parts} ms"

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict: each part's ms and source, and the contradiction."""
        return {
            "ttft_ms": self.ttft_ms,
            "steps": [{"name": s.name, "ms": s.ms, "source": s.source} for s in self.steps],
            "headers_ms": self.headers_ms,
            "contradiction": self.contradiction,
        }


def waterfall(
    ttft_ms: float,
    *,
    connect_ms: float | None = None,
    sent_ms: float | None = None,
    headers_ms: float | None = None,
    queue_ms: float | None = None,
    prefill_ms: float | None = None,
    server_ttft_ms: float | None = None,
    source: str = "the server",
    load_ms: float | None = None,
) -> Waterfall:
    """The waterfall of a TTFT of `ttft_ms`: `connect_ms` and `sent_ms` (the body all
    written, from the send) measured here; `queue_ms`, `prefill_ms` and the server's own
    time to first token `server_ttft_ms` as the server (`source`) said them."""
    here = "measured here"
    connect = connect_ms if connect_ms is not None else None
    sent = max(0.0, sent_ms - (connect or 0.0)) if sent_ms is not None else None
    # the most time the server can have had: from the connection's opening to the first
    # token (the body's "all written" stamp is taken here after the write returns, and
    # on a busy client it can trail the server's receipt: it bounds nothing)
    budget = max(0.0, ttft_ms - (connect or 0.0))
    steps = [Step(CONNECT, connect, here), Step(SENT, sent, here)]
    parts = {LOAD: load_ms, QUEUED: queue_ms, PREFILL: prefill_ms}
    said = [v for v in (*parts.values(), server_ttft_ms) if v is not None]
    if not said:
        return Waterfall(
            ttft_ms, (*steps, Step(REST, max(0.0, budget - (sent or 0.0)), here)), headers_ms
        )
    claims = [f"{n} {v:,.0f} ms" for n, v in parts.items() if v is not None and beyond(v, budget)]
    if server_ttft_ms is not None and beyond(server_ttft_ms, budget):
        claims.append(f"time to first token {server_ttft_ms:,.0f} ms")
    both = [v for v in parts.values() if v is not None]
    if not claims and len(both) >= 2 and beyond(sum(both), budget):
        named = " + ".join(n for n, v in parts.items() if v is not None)
        claims.append(f"{named} {sum(both):,.0f} ms")
    if claims:
        why = (
            f"contradiction: {source} says {', '.join(claims)}, longer than the "
            f"{budget:,.0f} ms from the request's send to its first token measured here: "
            "its figures are unknown"
        )
        unknown = [Step(n, None, source) for n in parts if n != LOAD or load_ms is not None]
        return Waterfall(ttft_ms, (*steps, *unknown, Step(REST, None, here)), headers_ms, why)
    own = sum(both)
    other = None
    if server_ttft_ms is not None and server_ttft_ms > own:
        other, own = server_ttft_ms - own, server_ttft_ms
    if sent is not None and sent > budget - own:  # the stamp trailed the server's receipt
        steps[1] = Step(SENT, max(0.0, budget - own), here)
    steps += [Step(n, v, source) for n, v in parts.items() if v is not None]
    if other is not None:
        steps.append(Step(OTHER, other, source))
    steps.append(Step(REST, max(0.0, budget - own - (steps[1].ms or 0.0)), here))
    return Waterfall(ttft_ms, tuple(steps), headers_ms)


def waterfall_of(m: Metrics) -> Waterfall | None:
    """A remote answer's waterfall from its metrics (None: a local answer, or one
    without a first token)."""
    if m.headers_ms is None or m.ttft_ms is None or m.ttft_ms <= 0:
        return None
    return waterfall(
        m.ttft_ms,
        connect_ms=m.connect_ms,
        sent_ms=m.sent_ms,
        headers_ms=m.headers_ms,
        queue_ms=m.server_queue_ms,
        prefill_ms=m.server_prompt_ms,
        server_ttft_ms=m.server_ttft_ms,
        source=m.server_source or "the server",
        load_ms=m.server_load_ms,
    )
