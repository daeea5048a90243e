"""A request's metric set (`Metrics`) as small records, each figure declared once with its
bound beside it: `TimingFigures` (our clock), `TokenFigures` (the counts and where they
came from), `ServerFigures` (the server's own account), `KvFigures` (the cache and the
memory it costs), `CpuFigures` (the local engine's threads and its neighbours) and
`DraftFigures` (speculative decoding). What each figure means: telemetry/metrics.py,
which computes them.

The records are the storage and the grouping: code that wants one kind of figure takes
that record (the waterfall the timing and the server's account, a bench row the timing
and the counts) and a check reads the bounds off the records' declarations
(telemetry/read_back.py). A `Metrics` also reads every figure under its flat name
(`m.ttft_ms` is `m.timing.ttft_ms`): about 2,400 places read the flat names (172 of them
`.ttft_ms`), and a chat saved, an export and `ask --json` are flat objects of those names.
A flat name is a read-only view (`_View`), not a copy: its type comes from the record's
field (inferred, never written twice), and a view that reads another field than its name
is refused when the class is made. The views are declared in the order the figures are
stored and exported (`flat_names()`: the CSV's columns as before the records).

Stored as before: `as_dict()` writes the flat object (every name of `flat_names()`, and
`ignored` where a figure was), and `metrics_from_dict` reads one back, old or new.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_type_hints, overload

from phasechat.telemetry.bounds import Bytes, Count, Cpus, GbS, Ms, PerToken, Rate, Share

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TimingFigures:
    """Times and rates measured on our own clock, from the request's send (ms)."""

    ttft_ms: Ms | None
    ttfo_ms: Ms | None
    e2e_ms: Ms | None
    first_byte_ms: Ms | None
    reasoning_ms: Ms | None
    prefill_tok_s: Rate | None
    decode_tok_s: Rate | None
    tpot_ms: Ms | None
    itl_ms_p50: Ms | None
    itl_ms_p95: Ms | None
    itl_ms_p99: Ms | None
    itl_ms_max: Ms | None
    chars_per_s: Rate | None
    prefill_share: Share | None
    decode_share: Share | None
    #: remote: the request's own phases before its first token (connect: TCP and TLS,
    #: 0 on a kept-alive connection; headers: the response's status line arrived)
    connect_ms: Ms | None
    headers_ms: Ms | None
    #: the second token event, after the request was sent
    time_to_second_token_ms: Ms | None
    #: the part of `ttft_ms` spent waiting for the model to load (None: no such wait)
    load_ms: Ms | None
    #: remote: when the request's body was all written (ms after the send)
    sent_ms: Ms | None
    #: why `decode_tok_s` (and TPOT, chars/s) is unknown: the tokens came in a burst
    decode_unknown: str | None

    @property
    def ttft_ready_ms(self) -> float | None:
        """TTFT from when the model was ready: the request's own wait (`ttft_ms` less
        `load_ms`), what prefill and its forecasts are measured by."""
        if self.ttft_ms is None or self.load_ms is None:
            return self.ttft_ms
        return max(0.0, self.ttft_ms - self.load_ms)


@dataclass(frozen=True, slots=True)
class TokenFigures:
    """The prompt's and the answer's counts, each with where it came from."""

    prompt_tokens: Count | None
    prompt_tokens_source: str
    cached_tokens: Count | None
    evaluated_prompt_tokens: Count | None
    output_tokens: Count
    output_tokens_estimated: bool
    reasoning_tokens: Count | None
    reasoning_tokens_source: str
    answer_tokens: Count | None
    #: False: the server did not say how much of the prompt it had cached
    cache_reported: bool
    chars: Count
    chars_per_token: PerToken | None


@dataclass(frozen=True, slots=True)
class ServerFigures:
    """The engine's own account beside ours: llama-server's `timings`, a server's
    /metrics, or the local engine's llama.cpp counters."""

    server_prompt_n: Count | None
    server_cache_n: Count | None
    server_prompt_ms: Ms | None
    server_predicted_n: Count | None
    server_predicted_ms: Ms | None
    server_prefill_tok_s: Rate | None
    server_decode_tok_s: Rate | None
    #: where the `server_*` figures came from: "timings" (llama-server, per request),
    #: "vLLM /metrics" (its counters read before and after), "llama.cpp" (the local
    #: engine's counters); None: nowhere. With /metrics: the server's own time to first
    #: token and queue time, and the transport's share of ours (ours - the server's).
    server_source: str | None
    server_ttft_ms: Ms | None
    server_queue_ms: Ms | None
    transport_ms: Ms | None
    #: why the server's account of this request is unknown (requests overlapped)
    server_unknown: str | None
    #: what the server said of the prompt's cache hit (0-1) and of the workers that ran
    #: its prefill and its decode where it splits them (Dynamo): ids shown, never obeyed
    server_kv_hit_share: Share | None
    server_prefill_worker: str | None
    server_decode_worker: str | None
    #: the server's own names and definitions of its queue and prefill figures, where
    #: they are not a queue and a prefill (Dynamo: its frontend's tokenizing and routing,
    #: its worker's queue and prefill together); None: as named
    server_queue_name: str | None
    server_queue_means: str | None
    server_prefill_name: str | None
    server_prefill_means: str | None
    #: the server's own wait for the model to load before this request (Ollama's
    #: `load_duration`): part of the TTFT, apart from the prefill
    server_load_ms: Ms | None


@dataclass(frozen=True, slots=True)
class KvFigures:
    """The KV cache: the engine's (for a server, what this chat holds of its window),
    the server's pool, and the memory a decode step reads."""

    kv_used_tokens: Count | None
    kv_capacity_tokens: Count | None
    kv_bytes: Bytes | None
    implied_bandwidth_gb_s: GbS | None
    context_window: Count | None
    context_source: str | None
    #: the server's KV pool, shared by every request (not this request's window), how
    #: full it was when the request was sent (0-1), and its block: KV and prefix-cache
    #: hits come in whole blocks
    server_kv_pool_tokens: Count | None
    server_kv_used_share: Share | None
    server_kv_block_tokens: Count | None
    #: local, with layers on a GPU: the bytes a decode step reads from the GPU's memory
    #: and from the host's (None: every layer on the CPU, or a server)
    gpu_bytes_per_token: Bytes | None
    cpu_bytes_per_token: Bytes | None


@dataclass(frozen=True, slots=True)
class CpuFigures:
    """The local engine's CPUs (all None for a server)."""

    #: its decode threads at the end, how often they changed mid-answer, and why the
    #: last change was made
    threads: Count | None
    thread_changes: Count | None
    threads_reason: str | None
    #: the CPUs' worth of other processes' work while the engine decoded, and the CPUs
    #: it may run on (None: a span too short to tell)
    busy_cpus: Cpus | None
    cpus: Count | None


@dataclass(frozen=True, slots=True)
class DraftFigures:
    """Speculative decoding (llama-server): drafted and accepted tokens, and the share."""

    server_draft_n: Count | None
    server_draft_accepted: Count | None
    draft_acceptance: Share | None


class _View(property, Generic[T]):
    """One record's figure read under its own name from the metric set: `read` is
    `lambda m: m.<record>.<name>`, so that its type is the field's, inferred. A view
    reads through C (`property` over `operator.attrgetter`): a flat name costs no
    Python call, as the field it was before the records."""

    def __init__(self, read: Callable[[Metrics], T]) -> None:
        self.path = ".".join(read.__code__.co_names)  # `record.name`
        super().__init__(attrgetter(self.path))  # `name` is set once the view is named

    def __set_name__(self, owner: type, name: str) -> None:
        if self.path.partition(".")[2] != name:  # a view named for one figure and reading another
            raise TypeError(f"the view {name} reads {self.path}")
        self.name: str = name

    if TYPE_CHECKING:

        @overload
        def __get__(self, obj: None, owner: type) -> _View[T]: ...
        @overload
        def __get__(self, obj: Metrics, owner: type | None = None) -> T: ...
        def __get__(self, obj: Metrics | None, owner: type | None = None) -> T | _View[T]: ...


@dataclass(frozen=True, slots=True)
class Metrics:
    """The metric set of one request (None where not measurable), in its records."""

    backend: str
    model: str
    finish: str | None
    timing: TimingFigures
    tokens: TokenFigures
    server: ServerFigures
    kv: KvFigures
    cpu: CpuFigures
    draft: DraftFigures
    warnings: tuple[str, ...]
    #: read back from disk (telemetry/read_back.py): the fields whose stored value was
    #: not plausible, each named with it ("ttft_ms (nan)"); those fields are None
    ignored: tuple[str, ...] = ()

    # Each figure under its flat name, in the order stored and exported (the module's
    # docstring says why they are here).
    ttft_ms = _View(lambda m: m.timing.ttft_ms)
    ttfo_ms = _View(lambda m: m.timing.ttfo_ms)
    e2e_ms = _View(lambda m: m.timing.e2e_ms)
    first_byte_ms = _View(lambda m: m.timing.first_byte_ms)
    prompt_tokens = _View(lambda m: m.tokens.prompt_tokens)
    prompt_tokens_source = _View(lambda m: m.tokens.prompt_tokens_source)
    cached_tokens = _View(lambda m: m.tokens.cached_tokens)
    evaluated_prompt_tokens = _View(lambda m: m.tokens.evaluated_prompt_tokens)
    output_tokens = _View(lambda m: m.tokens.output_tokens)
    output_tokens_estimated = _View(lambda m: m.tokens.output_tokens_estimated)
    reasoning_tokens = _View(lambda m: m.tokens.reasoning_tokens)
    reasoning_tokens_source = _View(lambda m: m.tokens.reasoning_tokens_source)
    reasoning_ms = _View(lambda m: m.timing.reasoning_ms)
    answer_tokens = _View(lambda m: m.tokens.answer_tokens)
    prefill_tok_s = _View(lambda m: m.timing.prefill_tok_s)
    cache_reported = _View(lambda m: m.tokens.cache_reported)
    decode_tok_s = _View(lambda m: m.timing.decode_tok_s)
    tpot_ms = _View(lambda m: m.timing.tpot_ms)
    itl_ms_p50 = _View(lambda m: m.timing.itl_ms_p50)
    itl_ms_p95 = _View(lambda m: m.timing.itl_ms_p95)
    itl_ms_p99 = _View(lambda m: m.timing.itl_ms_p99)
    itl_ms_max = _View(lambda m: m.timing.itl_ms_max)
    chars = _View(lambda m: m.tokens.chars)
    chars_per_s = _View(lambda m: m.timing.chars_per_s)
    chars_per_token = _View(lambda m: m.tokens.chars_per_token)
    prefill_share = _View(lambda m: m.timing.prefill_share)
    decode_share = _View(lambda m: m.timing.decode_share)
    kv_used_tokens = _View(lambda m: m.kv.kv_used_tokens)
    kv_capacity_tokens = _View(lambda m: m.kv.kv_capacity_tokens)
    kv_bytes = _View(lambda m: m.kv.kv_bytes)
    implied_bandwidth_gb_s = _View(lambda m: m.kv.implied_bandwidth_gb_s)
    server_prompt_n = _View(lambda m: m.server.server_prompt_n)
    server_cache_n = _View(lambda m: m.server.server_cache_n)
    server_prompt_ms = _View(lambda m: m.server.server_prompt_ms)
    server_predicted_n = _View(lambda m: m.server.server_predicted_n)
    server_predicted_ms = _View(lambda m: m.server.server_predicted_ms)
    server_prefill_tok_s = _View(lambda m: m.server.server_prefill_tok_s)
    server_decode_tok_s = _View(lambda m: m.server.server_decode_tok_s)
    server_draft_n = _View(lambda m: m.draft.server_draft_n)
    server_draft_accepted = _View(lambda m: m.draft.server_draft_accepted)
    draft_acceptance = _View(lambda m: m.draft.draft_acceptance)
    context_window = _View(lambda m: m.kv.context_window)
    context_source = _View(lambda m: m.kv.context_source)
    threads = _View(lambda m: m.cpu.threads)
    thread_changes = _View(lambda m: m.cpu.thread_changes)
    threads_reason = _View(lambda m: m.cpu.threads_reason)
    connect_ms = _View(lambda m: m.timing.connect_ms)
    headers_ms = _View(lambda m: m.timing.headers_ms)
    time_to_second_token_ms = _View(lambda m: m.timing.time_to_second_token_ms)
    load_ms = _View(lambda m: m.timing.load_ms)
    server_source = _View(lambda m: m.server.server_source)
    server_ttft_ms = _View(lambda m: m.server.server_ttft_ms)
    server_queue_ms = _View(lambda m: m.server.server_queue_ms)
    transport_ms = _View(lambda m: m.server.transport_ms)
    server_unknown = _View(lambda m: m.server.server_unknown)
    server_kv_pool_tokens = _View(lambda m: m.kv.server_kv_pool_tokens)
    server_kv_used_share = _View(lambda m: m.kv.server_kv_used_share)
    server_kv_block_tokens = _View(lambda m: m.kv.server_kv_block_tokens)
    sent_ms = _View(lambda m: m.timing.sent_ms)
    server_kv_hit_share = _View(lambda m: m.server.server_kv_hit_share)
    server_prefill_worker = _View(lambda m: m.server.server_prefill_worker)
    server_decode_worker = _View(lambda m: m.server.server_decode_worker)
    server_queue_name = _View(lambda m: m.server.server_queue_name)
    server_queue_means = _View(lambda m: m.server.server_queue_means)
    server_prefill_name = _View(lambda m: m.server.server_prefill_name)
    server_prefill_means = _View(lambda m: m.server.server_prefill_means)
    server_load_ms = _View(lambda m: m.server.server_load_ms)
    gpu_bytes_per_token = _View(lambda m: m.kv.gpu_bytes_per_token)
    cpu_bytes_per_token = _View(lambda m: m.kv.cpu_bytes_per_token)
    busy_cpus = _View(lambda m: m.cpu.busy_cpus)
    cpus = _View(lambda m: m.cpu.cpus)
    decode_unknown = _View(lambda m: m.timing.decode_unknown)
    # derived, not stored
    ttft_ready_ms = _View(lambda m: m.timing.ttft_ready_ms)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready flat dict of every figure (`ignored` only when a field was)."""
        d = {name: getattr(self, name) for name in flat_names()}
        d["warnings"] = list(self.warnings)
        if self.ignored:
            d["ignored"] = list(self.ignored)
        return d


@functools.cache
def records() -> tuple[tuple[str, type[Any]], ...]:
    """Each record of `Metrics`: its attribute and its class, in their order."""
    hints = get_type_hints(Metrics)
    return tuple((f.name, hints[f.name]) for f in fields(Metrics) if is_dataclass(hints[f.name]))


@functools.cache
def flat_names() -> tuple[str, ...]:
    """Every stored figure's flat name, in the order stored and exported: the metric
    set's own (`backend`, `model`, `finish`), each record's in the order its view is
    declared, then `warnings` (not `ignored`, written only where a figure was)."""
    stored = {f.name for _, cls in records() for f in fields(cls)}
    views = [v.name for v in vars(Metrics).values() if isinstance(v, _View)]
    return ("backend", "model", "finish", *(n for n in views if n in stored), "warnings")


def of_flat(values: dict[str, Any]) -> Metrics:
    """A `Metrics` of flat names: each record built of its own fields' values (every
    name of `flat_names()` is needed; `ignored` is optional)."""
    built = {attr: cls(**{f.name: values[f.name] for f in fields(cls)}) for attr, cls in records()}
    return Metrics(
        backend=values["backend"],
        model=values["model"],
        finish=values["finish"],
        warnings=values["warnings"],
        ignored=values.get("ignored", ()),
        **built,
    )


def flat(record: Any) -> dict[str, Any]:
    """One record's figures under their flat names (a record's field is its figure's
    flat name)."""
    return asdict(record)


def metrics_from_dict(data: dict[str, Any]) -> Metrics:
    """A `Metrics` back from `as_dict()` (e.g. from the chat database); unknown keys are
    ignored and missing ones are None, so records from older versions still load."""
    values: dict[str, Any] = {name: data.get(name) for name in flat_names()}
    values["warnings"] = tuple(data.get("warnings") or ())
    values["ignored"] = tuple(data.get("ignored") or ())
    values["output_tokens"] = int(data.get("output_tokens") or 0)
    values["chars"] = int(data.get("chars") or 0)
    values["output_tokens_estimated"] = bool(data.get("output_tokens_estimated"))
    values["prompt_tokens_source"] = str(data.get("prompt_tokens_source") or "none")
    values["cache_reported"] = bool(data.get("cache_reported", True))
    values["reasoning_tokens_source"] = str(data.get("reasoning_tokens_source") or "none")
    values["backend"] = str(data.get("backend") or "")
    values["model"] = str(data.get("model") or "")
    return of_flat(values)
