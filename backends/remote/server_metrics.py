"""A server's own account of one request, from its Prometheus `/metrics`.

vLLM sends usage and no timings; what it measured itself is in `/metrics`: counters and
histogram sums that only grow. Read before and after a request, their differences are
that request's figures (prefill, decode, queue and first-token time, prompt, cached and
generated tokens), as long as nothing else ran on the server meanwhile. llama-server with
`--metrics` exports the same kind of counters (its `timings` already say as much, per
request). The gauges say what the server holds: its KV pool (vLLM's
`cache_config_info`: blocks x block size, shared by every request) and how full it is.

Every figure is checked: a finite, non-negative number (duplicate lines that sum to
infinity are no number), counts in bounds. A counter that ran backwards is a restarted
server: that request has no account. A request that overlapped another has no account
(`ServerAccount.unknown` says why), never someone else's. What is left is bounded by the
request as the client measured it (`Span`): no phase longer than its whole wall time, no
more prompt tokens than were sent, no more generated than were asked for; a figure
beyond that is unknown, and `ServerAccount.doubts` says why in one line.

The names read, and where each server serves its page, are its family's `metrics`
(backends/remote/servers/: vLLM 0.32's `vllm/v1/metrics/loggers.py`, recorded in
tests/fixtures/vllm/; llama.cpp's `tools/server/server-context.cpp`; and the others
from their documentation).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

from phasechat.backends.events import Message, ServerAccount, Usage
from phasechat.backends.remote.servers import FAMILIES
from phasechat.backends.remote.servers.family import PromNames
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.remote.windows import read_body
from phasechat.backends.remote.wire_numbers import MAX_TOKENS, prompt_bound

#: The longest a scrape may take (a 50 KB page; a slow server means no account).
DEADLINE_S = 2.0
#: The largest /metrics page read (vLLM's is about 50 KB).
MAX_BODY = 4 * 1024 * 1024
#: The largest KV pool believed, in tokens (a few hundred GB of KV on many GPUs).
MAX_POOL = 1 << 32
#: After the stream ends, how long to wait for the server to count the request (vLLM
#: records a finished request's histograms a moment after its last chunk).
SETTLE_S = 1.5

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Scrape:
    """One read of `/metrics`: the figures above (summed over label sets; None: not
    exported or not believed) and the pool."""

    engine: str  # the family's `PromNames.engine`: "vLLM", "llama-server"
    values: dict[str, float]
    pool_tokens: int | None
    block_tokens: int | None
    #: figures whose lines summed to no finite number (duplicates of 1e308), with that sum
    broken: tuple[tuple[str, float], ...] = ()
    #: its prompt count is of evaluated tokens, the cached ones counted apart
    excludes_cached: bool = False
    #: where the family serves the page (its `PromNames.path`)
    page: str = "/metrics"

    @property
    def source(self) -> str:
        """What an account from this page says it is from: "vLLM /metrics"."""
        return f"{self.engine} {self.page}"

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse(text: str, names: PromNames | None = None) -> Scrape | None:
    """The figures in a Prometheus text page, or None when it is no server we know.
    `names`: the family the server is known to be (its page may hold none of its names
    yet: a server writes a metric when it first counts something)."""
    sums: dict[str, float] = {}
    labels_of: dict[str, str] = {}
    declared: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            declared.update(_declared(line))
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, raw = m.groups()
        if labels:
            labels_of[name] = labels
        if name.endswith("_info"):  # an info gauge says its figures in its labels
            continue
        value = _number(raw)
        if value is not None:
            sums[name] = sums.get(name, 0.0) + value
    names = names or _family_of({**dict.fromkeys(declared, 0.0), **sums})
    if names is None:
        return None
    values = {}
    for key, sources in names.names.items():
        found = [sums[s] for s in sources if s in sums]
        if found:
            values[key] = sum(found)
        elif declared.intersection(sources):
            # declared with no sample: nothing counted yet (prometheus_client writes a
            # label set's first sample when it is first counted: SGLang's cached
            # tokens only when some were cached)
            values[key] = 0.0
    for key, source in names.fallbacks.items():
        if key not in values and source in sums:
            values[key] = sums[source]
    # each line is finite, but two of 1e308 sum to inf (and inf - inf is nan)
    broken = tuple((k, v) for k, v in values.items() if not math.isfinite(v))
    for key, _ in broken:
        del values[key]
    if not 0 <= values.get("used_share", 0) <= 1:
        del values["used_share"]
    info_labels = labels_of.get(names.pool_info, "") if names.pool_info else ""
    info = dict(_LABEL.findall(info_labels))
    block = _count(info.get("block_size"))
    blocks = _count(info.get("num_gpu_blocks"))
    pool = blocks * block if blocks and block else _count(info.get("kv_cache_size_tokens"))
    pool = pool if pool and pool <= MAX_POOL else None
    excluded = names.prompt_excludes_cached
    return Scrape(names.engine, values, pool, block, broken, excluded, names.path)


def _declared(line: str) -> tuple[str, ...]:
    """The sample names a `# TYPE <name> <kind>` line declares (a histogram's or a
    summary's `_sum` and `_count`)."""
    parts = line.split()
    if len(parts) != 4:
        return ()
    name, kind = parts[2], parts[3]
    if kind in ("histogram", "summary"):
        return (f"{name}_sum", f"{name}_count")
    return (name,)


def _family_of(sums: dict[str, float]) -> PromNames | None:
    """The Prometheus names of the family whose names the page holds (None: none)."""
    for family in FAMILIES:
        if family.metrics is not None and any(k.startswith(family.metrics.prefix) for k in sums):
            return family.metrics
    return None


def _number(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _count(raw: str | None) -> int | None:
    """A label's positive whole number (ASCII digits, at most 12 of them), else None."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        return None
    return int(raw) or None


#: Our clock and a server's tick and run a little differently: a server's span may
#: exceed the same span measured here by this share and this many ms before it is
#: impossible.
SLACK_SHARE = 0.05
SLACK_MS = 1.0
#: the counters (figures that only grow) and what each counts, for a line that names one
COUNTERS = {
    "finished": "finished requests",
    "prompt": "prompt tokens",
    "cached": "cached prompt tokens",
    "generated": "generated tokens",
    "prefill_s": "prefill seconds",
    "decode_s": "decode seconds",
    "queue_s": "queue seconds",
    "ttft_s": "first-token seconds",
}


def beyond(server_ms: float, client_ms: float) -> bool:
    """Is `server_ms` longer than `client_ms`, a span that holds it as measured here,
    by more than the two clocks can disagree?"""
    return server_ms > client_ms * (1 + SLACK_SHARE) + SLACK_MS


@dataclass(frozen=True, slots=True)
class Span:
    """The request as this client measured it, which bounds the server's account of it:
    its wall time from the send to the end of the answer (ms), the most prompt tokens it
    can have had and the most tokens the server can have generated for it."""

    e2e_ms: float
    prompt_tokens: int
    output_tokens: int


def span_of(
    e2e_ms: float, messages: tuple[Message, ...], max_tokens: int, usage: Usage | None
) -> Span:
    """The bounds of a request: the server's own usage where it said (itself bounded:
    backends/remote/backend.py), else `prompt_bound` of its messages, and max_tokens."""
    prompt = usage.prompt_tokens if usage is not None else None
    if prompt is None:
        prompt = prompt_bound(messages)
    output = usage.completion_tokens if usage is not None else None
    return Span(e2e_ms, prompt, output if output is not None else max_tokens)


def account(
    before: Scrape | None, after: Scrape, usage: Usage | None, span: Span | None = None
) -> ServerAccount:
    """This request's figures: `after` - `before`, when nothing else ran meanwhile,
    bounded by `span` (the request as measured here) when given.

    Overlap is ruled out when no request was running or waiting at either read, at most
    one request finished between them (vLLM counts them), and the generated tokens the
    server counted are this request's own (`usage`, when it says)."""
    pool = ServerAccount(
        source=after.source,
        pool_tokens=after.pool_tokens,
        block_tokens=after.block_tokens,
        used_share=before.get("used_share") if before is not None else None,
    )
    why = _overlap(before, after, usage)
    if why is not None:
        return dataclasses.replace(pool, unknown=why)
    assert before is not None

    def delta(name: str) -> float | None:
        a, b = _start(before, after, name), after.get(name)
        return b - a if a is not None and b is not None and b >= a else None

    def tokens(name: str) -> int | None:
        d = delta(name)
        return round(d) if d is not None and d <= MAX_TOKENS else None

    def ms(name: str) -> float | None:
        d = delta(name)
        return d * 1000 if d is not None and d < 86_400 else None

    prompt, cached = tokens("prompt"), tokens("cached")
    if after.excludes_cached and prompt is not None and cached is not None:
        prompt += cached  # llama-server counts evaluated prompt tokens apart from cached
    if prompt is not None and cached is not None and cached > prompt:
        cached = None
    said = dataclasses.replace(
        pool,
        prompt_tokens=prompt,
        cached_tokens=cached,
        generated_tokens=tokens("generated"),
        prefill_ms=ms("prefill_s"),
        decode_ms=ms("decode_s"),
        queue_ms=ms("queue_s"),
        ttft_ms=ms("ttft_s"),
    )
    return _bounded(said, span) if span is not None else said


def _bounded(a: ServerAccount, span: Span) -> ServerAccount:
    """`a` without the figures `span` rules out, each named in `doubts` (one line for
    the times, one for each count)."""
    gone: dict[str, None] = {}
    doubts: list[str] = []
    if a.prompt_tokens is not None and a.prompt_tokens > span.prompt_tokens:
        gone |= {"prompt_tokens": None, "cached_tokens": None}
        doubts.append(
            f"{a.source}: {a.prompt_tokens:,} prompt tokens for a prompt of at most "
            f"{span.prompt_tokens:,}: not believed"
        )
    whole = a.prompt_tokens if a.prompt_tokens is not None else span.prompt_tokens
    if "cached_tokens" not in gone and a.cached_tokens is not None and a.cached_tokens > whole:
        gone["cached_tokens"] = None
        doubts.append(
            f"{a.source}: {a.cached_tokens:,} cached tokens of a prompt of at most "
            f"{whole:,}: not believed"
        )
    if a.generated_tokens is not None and a.generated_tokens > span.output_tokens:
        gone["generated_tokens"] = None
        doubts.append(
            f"{a.source}: {a.generated_tokens:,} tokens generated for an answer of at most "
            f"{span.output_tokens:,}: not believed"
        )
    phases = {
        "load_ms": "model load",
        "queue_ms": "queue",
        "prefill_ms": "prefill",
        "decode_ms": "decode",
    }
    times = {**phases, "ttft_ms": "time to first token"}
    claims = [
        (name, f"{value:,.0f} ms of {label}")
        for name, label in times.items()
        if (value := getattr(a, name)) is not None and beyond(value, span.e2e_ms)
    ]
    # load, queue, prefill and decode follow one another: together they fit in the whole
    left = [n for n in phases if getattr(a, n) is not None and n not in dict(claims)]
    total = sum(getattr(a, n) for n in left)
    if len(left) > 1 and beyond(total, span.e2e_ms):
        claims.append(("", f"{total:,.0f} ms of {' + '.join(phases[n] for n in left)}"))
        gone |= dict.fromkeys(left)
    if claims:
        gone |= {name: None for name, _ in claims if name}
        doubts.append(
            f"{a.source}: {', '.join(c for _, c in claims)} in a request of "
            f"{span.e2e_ms:,.0f} ms measured here: not believed"
        )
    fields: dict[str, Any] = {**gone, "doubts": tuple(doubts)}
    return dataclasses.replace(a, **fields)


def _overlap(before: Scrape | None, after: Scrape, usage: Usage | None) -> str | None:
    """Why the difference of `before` and `after` is not this request's alone (None: it is)."""
    if before is None:
        return "no earlier read of /metrics to compare with"
    if before.engine != after.engine:
        return "the server changed between the two reads of /metrics"
    for read in (before, after):
        for name, total in read.broken:
            what = COUNTERS.get(name, f"{name} figures")
            return f"the server's {what} are no number (its lines sum to {total})"
    restart = _restarted(before, after)
    if restart is not None:
        return restart
    if before.get("running") or after.get("running"):
        return "other requests ran on the server at the same time"
    finished_a, finished_b = _start(before, after, "finished"), after.get("finished")
    if finished_a is not None and finished_b is not None and finished_b - finished_a != 1:
        n = finished_b - finished_a
        return f"{n:g} requests finished on the server meanwhile, not 1"
    gen_a, gen_b = _start(before, after, "generated"), after.get("generated")
    said = usage.completion_tokens if usage is not None else None
    if gen_a is not None and gen_b is not None and said is not None:
        counted = gen_b - gen_a
        if counted > said:
            return (
                f"the server generated {counted:g} tokens meanwhile, this answer {said}: "
                "other requests ran at the same time"
            )
        if counted < said:
            # other requests only add to a count: fewer is the server's own count
            # disagreeing with its usage (or a proxy's usage), not a crowd
            return (
                f"mismatch: the server's /metrics counted {counted:g} generated tokens, "
                f"its usage {said} for this answer"
            )
    return None


def _restarted(before: Scrape, after: Scrape) -> str | None:
    """Why a counter that only grows went back between the reads (None: none did)."""
    for name, what in COUNTERS.items():
        a, b = before.get(name), after.get(name)
        if a is not None and b is not None and b < a:
            return (
                f"the server's count of {what} went back from {a:,.6g} to {b:,.6g}: "
                "it restarted, and this request has no account"
            )
    return None


async def scrape(
    client: httpx.AsyncClient,
    root: str,
    headers: dict[str, str],
    path: str = "/metrics",
    names: PromNames | None = None,
) -> Scrape | None:
    """`GET {root}{path}`, read within DEADLINE_S and MAX_BODY (as `names`' page where
    given); None when it fails."""
    try:
        async with (
            asyncio.timeout(DEADLINE_S),
            client.stream("GET", endpoint(root, path), headers=headers, timeout=DEADLINE_S) as r,
        ):
            if r.status_code != 200:
                return None
            body = await read_body(r, MAX_BODY)
    except (TimeoutError, httpx.HTTPError):
        return None
    return parse(body.decode("utf-8", errors="replace"), names) if body is not None else None


@dataclass(frozen=True, slots=True)
class Ticket:
    """A request of this backend: the how-many-th it was, and whether it began alone."""

    n: int
    alone: bool


#: why a request has no account when this client itself ran others beside it
CROWDED = "other requests of this client ran at the same time"


class MetricsWatch:
    """The reads of one server's `/metrics` for one backend: the last one is the next
    request's "before". `enabled` once a first read found a server it knows.

    Requests of this backend that overlap (a sweep's streams) are known to: none is read
    for (the server would only be loaded by reads whose figures must be null anyway);
    the last one out reads once, so that the next request alone has its "before"."""

    def __init__(self) -> None:
        self.enabled = False
        self.path = "/metrics"  # where the server's family serves its page
        self.names: PromNames | None = None  # its family's names, where known
        self.last: Scrape | None = None
        self.active = 0
        self.started = 0

    def begin(self) -> Ticket:
        self.active += 1
        self.started += 1
        return Ticket(self.started, self.active == 1)

    def end(self) -> None:
        self.active -= 1

    def alone(self, ticket: Ticket) -> bool:
        """No other request of this backend ran beside `ticket`'s (so far)."""
        return ticket.alone and self.started == ticket.n

    async def finished(
        self,
        ticket: Ticket,
        client: httpx.AsyncClient,
        root: str,
        headers: dict[str, str],
        usage: Usage | None,
        span: Span | None = None,
    ) -> ServerAccount | None:
        """The account of `ticket`'s request, which just ended (bounded by `span`)."""
        if self.alone(ticket):
            return await self.after(client, root, headers, usage, span)
        # the last one out reads once: a "before" for the next request
        read = (
            await scrape(client, root, headers, self.path, self.names) if self.active == 1 else None
        )
        last, self.last = self.last or read, read
        if last is None:
            return None
        return ServerAccount(
            last.source,
            pool_tokens=last.pool_tokens,
            block_tokens=last.block_tokens,
            unknown=CROWDED,
        )

    async def start(
        self,
        client: httpx.AsyncClient,
        root: str,
        headers: dict[str, str],
        path: str = "/metrics",
        names: PromNames | None = None,
    ) -> None:
        self.path, self.names = path, names
        self.last = await scrape(client, root, headers, path, names)
        self.enabled = self.last is not None

    async def after(
        self,
        client: httpx.AsyncClient,
        root: str,
        headers: dict[str, str],
        usage: Usage | None,
        span: Span | None = None,
    ) -> ServerAccount | None:
        """The account of the request that just ended (read again until the server has
        counted it, for up to SETTLE_S)."""
        before = self.last
        deadline = time.monotonic() + SETTLE_S
        while True:
            now = await scrape(client, root, headers, self.path, self.names)
            if now is None:
                self.last = None
                return None
            done = account(before, now, usage, span)
            counted = _counted(before, now, usage)
            if counted or time.monotonic() > deadline:
                self.last = now
                return done
            await asyncio.sleep(0.05)


def _counted(before: Scrape | None, after: Scrape, usage: Usage | None) -> bool:
    """Has the server counted the request yet (its finished count or its tokens moved)?"""
    if before is None or before.broken or after.broken or _restarted(before, after):
        return True  # broken or restarted: waiting longer will not make it this request's account
    for name in ("finished", "generated"):
        a, b = _start(before, after, name), after.get(name)
        if a is not None and b is not None:
            want = 1 if name == "finished" else (usage.completion_tokens if usage else 1) or 1
            return b - a >= want
    return True


def _start(before: Scrape, after: Scrape, name: str) -> float | None:
    """Counter `name` in `before`, 0 where only `after` has it: a counter a server has
    not yet written counted nothing (prometheus_client's multiprocess collector, which
    SGLang and TensorRT-LLM use, writes a label set's first sample when it first counts)."""
    said = before.get(name)
    if said is None and name in COUNTERS and after.get(name) is not None:
        return 0.0
    return said


#: the figures a server's per-request account gives that its /metrics' do not
_OWN = (
    "prompt_tokens",
    "cached_tokens",
    "generated_tokens",
    "prefill_ms",
    "decode_ms",
    "queue_ms",
    "ttft_ms",
    "kv_hit_share",
    "prefill_worker",
    "decode_worker",
    "load_ms",
)


def joined(
    own: ServerAccount | None, scraped: ServerAccount | None, span: Span
) -> ServerAccount | None:
    """One account of a request from the server's per-request fields (`own`, its
    family's) and its /metrics (`scraped`, already bounded): each figure the request's
    own where it has one, /metrics' elsewhere; `own` bounded by `span` as /metrics' is.
    A request that overlapped others still has its own figures: they are its alone."""
    if own is None:
        return scraped
    mine = _bounded(own, span)
    if scraped is None:
        return mine
    said = {name: value for name in _OWN if (value := getattr(mine, name)) is not None}
    return dataclasses.replace(
        scraped,
        **said,
        source=f"{mine.source} + {scraped.source}",
        unknown=None if said else scraped.unknown,
        doubts=mine.doubts + scraped.doubts,
    )
