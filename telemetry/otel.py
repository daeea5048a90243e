"""Each request as OpenTelemetry sees it: a GenAI span with its phases, and the client
metrics, sent over OTLP/HTTP by the OpenTelemetry SDK's own exporters.

Opt-in: `from_env` returns None, and nothing of the SDK is imported, unless
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not "true"). The rest is
the SDK's standard variables (headers, timeouts, per-signal endpoints, the service name,
the sampler, the propagators). Names follow the OpenTelemetry GenAI semantic
conventions: a CLIENT span "chat {model}" per request, with `gen_ai.*` and
`server.*` attributes, child spans for the phases timed by the recorder's own stamps,
and the histograms `gen_ai.client.operation.duration`, `gen_ai.client.token.usage`,
`gen_ai.client.operation.time_to_first_chunk` and
`gen_ai.client.operation.time_per_output_chunk` with the conventions' bucket boundaries.

Prompts and answers go into a span only when the conventions' own switch,
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`, asks for it; a server's error
text never does (it may quote the prompt): a failed span says the error's kind. No
header, key or URL with credentials is ever an attribute.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from phasechat.backends.base import Backend
from phasechat.backends.events import GenerationRequest
from phasechat.backends.remote.capability import RemoteServer
from phasechat.backends.remote.httplog import redact_url
from phasechat.telemetry.metrics import Metrics, compute, itl_ms
from phasechat.telemetry.recorder import Trace
from phasechat.telemetry.waterfall import waterfall_of

if TYPE_CHECKING:  # the SDK is imported only when tracing is on
    from opentelemetry.metrics import Histogram
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: the values of CONTENT_ENV that put the messages in the span: "true" (the first
#: instrumentations' boolean) and the modes that include spans (the newer ones)
CONTENT_ON = frozenset({"true", "1", "span_only", "span_and_event"})
#: how long closing (the app's exit) waits for the collector to take what is pending:
#: a collector that does not answer never holds the exit longer (what it has not taken
#: is dropped, and said once)
CLOSE_WAIT_S = 1.0

#: The conventions' ExplicitBucketBoundaries, for every duration histogram (s) and for
#: token counts (docs/gen-ai/gen-ai-metrics.md of the GenAI semantic conventions).
SECONDS_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

DURATION = "gen_ai.client.operation.duration"
TOKEN_USAGE = "gen_ai.client.token.usage"
TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"

#: the span of the request this task is sending, for its `traceparent` (see `headers`)
_sending: ContextVar[Span | None] = ContextVar("phasechat_otel_sending", default=None)


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment turns tracing on (an OTLP endpoint, the SDK not disabled)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(env.get(ENDPOINT_ENV, "").strip())


def from_env() -> TurnExporter | None:
    """A `TurnExporter` when the environment turns tracing on, else None (and the SDK is
    not even imported). The SDK reads its own settings from the environment too; raises
    ValueError, in one line, for one that would fail every request."""
    if not enabled():
        return None
    return TurnExporter(capture_content=captures_content(os.environ))


def collector() -> str:
    """The endpoint the spans go to, as it may be shown (no credentials, no query)."""
    said = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"
    )
    return redact_url(said.strip())


class _SdkLog(logging.Handler):
    """Where the OpenTelemetry SDK's log records go instead of stderr: each becomes one
    line of our own words (`sdk_line`), handed to `sink` (the tracing's notes). The
    SDK's own text is never shown: it quotes a malformed header whole, token and all."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.sink: Callable[[str], None] = lambda line: None

    def emit(self, record: logging.LogRecord) -> None:
        self.sink(sdk_line(record))


_SDK_LOG = _SdkLog()


def sdk_line(record: logging.LogRecord) -> str:
    """One of the SDK's warnings in our words: what it is about, never its arguments (a
    header's value, a collector's token)."""
    said = str(record.msg)
    if said.startswith("Header format invalid"):
        return (
            "OTEL_EXPORTER_OTLP_HEADERS (or a per-signal ..._HEADERS): a header that is "
            "not name=value, URL-encoded, is left out (not shown: it may hold a token)"
        )
    if said.startswith("Couldn't recognize sampler"):
        return (
            "OTEL_TRACES_SAMPLER names no sampler the OpenTelemetry SDK knows: its default "
            "(parentbased_always_on) is used"
        )
    if "TRACES_SAMPLER_ARG" in said:
        return "OTEL_TRACES_SAMPLER_ARG is not a number: the sampler's rate is 1.0"
    return (
        f"the OpenTelemetry SDK warned ({record.name}, {record.levelname.lower()}); its "
        "words are not shown, as they may quote a header"
    )


def _quiet_sdk(sink: Callable[[str], None]) -> None:
    """Route the SDK's log records to `sink`, not to stderr (Python's last-resort
    handler printed them there, after the app's exit: a collector's token among them)."""
    sdk = logging.getLogger("opentelemetry")
    if _SDK_LOG not in sdk.handlers:
        sdk.addHandler(_SDK_LOG)
    sdk.propagate = False
    _SDK_LOG.sink = sink


def _exporters(refused: Callable[[], None]) -> tuple[Any, Any]:
    """The SDK's OTLP/HTTP span and metric exporters, each calling `refused()` when
    the collector did not take a batch (after the SDK's own retries)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Spans(OTLPSpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            result = super().export(spans)
            if result is not SpanExportResult.SUCCESS:
                refused()
            return result

    class Points(OTLPMetricExporter):
        def export(
            self, metrics_data: MetricsData, timeout_millis: float | None = 10000, **kwargs: Any
        ) -> MetricExportResult:
            result = super().export(metrics_data, timeout_millis, **kwargs)
            if result is not MetricExportResult.SUCCESS:
                refused()
            return result

    return Spans(), Points()


def captures_content(environ: Mapping[str, str]) -> bool:
    """Whether the conventions' switch asks for the messages in the span."""
    return environ.get(CONTENT_ENV, "").strip().lower() in CONTENT_ON


@dataclass(frozen=True, slots=True)
class Peer:
    """Who answers a request, as the conventions name it."""

    provider: str
    address: str | None = None
    port: int | None = None


def peer_of(backend: Backend) -> Peer:
    """The provider and, for a server, its host and port (never the URL's credentials,
    path or query). A remote backend speaks the OpenAI API, the provider name the
    conventions give that format; the local engine is llama.cpp (a name of our own)."""
    if isinstance(backend, RemoteServer):
        url = httpx.URL(backend.base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return Peer("openai", url.host or None, port)
    return Peer("llama.cpp")


@dataclass
class _Open:
    """A request whose span is open: what its end needs."""

    span: Span
    trace: Trace
    request: GenerationRequest
    peer: Peer
    #: wall clock minus the process clock when it was sent: the recorder's stamps
    #: (`perf_counter_ns`) become span times with this one offset, so phases never
    #: overlap or gap for a clock step during the request
    offset_ns: int


class TurnExporter:
    """Turns each request's `Trace` into a span tree and metric points, and sends them.

    `request_sent` opens the request's span (so its `traceparent` can go with the HTTP
    request: `headers`); `request_ended` closes it with the phases and the figures. The
    metric points and the sending are a background thread's: the UI never waits on the
    collector."""

    def __init__(self, *, capture_content: bool = False) -> None:
        #: the SDK's warnings about its settings, each once, in our words (`sdk_line`):
        #: shown by the app (toasts) and `ask` (stderr); never the SDK's own text
        self.notes: list[str] = []
        #: set by `close` when the collector did not take the last of it in time
        self.dropped: str | None = None
        _quiet_sdk(self._note)
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        try:  # reads OTEL_PROPAGATORS: a misspelt one stops the start, not each request
            from opentelemetry import propagate
        except ValueError as exc:
            raise ValueError(f"OTEL_PROPAGATORS: {exc}") from None
        self._inject = propagate.inject
        # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, when set, name the service.
        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        resource = Resource.create({} if named else {"service.name": "phasechat"})
        self.capture_content = capture_content
        # Not shut down by the SDK at the interpreter's exit: `close` does, within
        # CLOSE_WAIT_S (the SDK's own exit hook waits for a dead collector, 20 s).
        self.tracer_provider: TracerProvider = TracerProvider(
            resource=resource, shutdown_on_exit=False
        )
        #: the last error of the background thread or the last batch the collector did
        #: not take (None: none), shown by the app and `ask`
        self.problem: str | None = None
        # the exporters' own warnings (each retry, each failed batch) would fill `ask`'s
        # stderr: phasechat says it once, from `problem` (the app: a toast)
        logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.CRITICAL)
        spans, points = _exporters(self._refused)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(spans))
        reader = PeriodicExportingMetricReader(points)
        self.meter_provider: MeterProvider = MeterProvider(
            metric_readers=[reader], resource=resource, shutdown_on_exit=False
        )
        self._tracer = self.tracer_provider.get_tracer("phasechat")
        meter = self.meter_provider.get_meter("phasechat")
        self._duration = _histogram(meter, DURATION, "s", "GenAI operation duration.")
        self._tokens = _histogram(
            meter, TOKEN_USAGE, "{token}", "Number of input and output tokens used."
        )
        self._first_chunk = _histogram(
            meter, TIME_TO_FIRST_CHUNK, "s", "Time to receive the first chunk."
        )
        self._per_chunk = _histogram(
            meter, TIME_PER_OUTPUT_CHUNK, "s", "Time per output chunk after the first one."
        )
        self._open: dict[int, _Open] = {}
        #: what the background thread does, in order: each request's metric points and
        #: sending; None stops it. A daemon: a collector that does not answer never
        #: holds the interpreter's exit.
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        threading.Thread(target=self._work, name="otel", daemon=True).start()
        self._closed = False

    # -- the request's life ------------------------------------------------------------
    def request_sent(self, trace: Trace, request: GenerationRequest, backend: Backend) -> None:
        """Open the span of `trace`'s request, about to be sent by `backend` (from when
        it started waiting to be sent, if it did); until it ends, `headers` carries it."""
        from opentelemetry.trace import SpanKind

        offset = time.time_ns() - time.perf_counter_ns()
        began = trace.t_queued or time.perf_counter_ns()
        peer = peer_of(backend)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": peer.provider,
            "gen_ai.request.model": trace.model,
            "gen_ai.request.max_tokens": request.max_tokens,
            "gen_ai.request.temperature": request.temperature,
        }
        if request.seed is not None:
            attributes["gen_ai.request.seed"] = request.seed
        if request.stop:
            attributes["gen_ai.request.stop_sequences"] = list(request.stop)
        attributes.update(_server(peer))
        span = self._tracer.start_span(
            f"chat {trace.model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=began + offset,
        )
        self._open[id(trace)] = _Open(span, trace, request, peer, offset)
        _sending.set(span)

    def headers(self) -> dict[str, str]:
        """The W3C trace context of the request this task is sending (`traceparent`,
        by the SDK's propagators), so a server that traces nests its spans under it;
        empty when no request of ours is being sent."""
        span = _sending.get()
        if span is None:
            return {}
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        self._inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def request_ended(self, trace: Trace, metrics: Metrics) -> None:
        """Close `trace`'s span (nothing when it was never sent): its phases as child
        spans, the usage and the error. The metric points (one per chunk: thousands for
        a long answer) are recorded in the background thread, which then sends
        everything: the event loop only reads the gaps between chunks."""
        opened = self._open.pop(id(trace), None)
        if opened is None:
            return
        if _sending.get() is opened.span:
            _sending.set(None)
        self._finish_span(opened, metrics)
        common: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": opened.peer.provider,
            "gen_ai.request.model": trace.model,
            **_answered_by(opened.peer, trace),
            **_server(opened.peer),
        }
        error, gaps = _error_type(trace), itl_ms(trace)
        self._jobs.put(lambda: self._record(common, error, metrics, gaps))

    def _finish_span(self, o: _Open, metrics: Metrics) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        span, trace, off = o.span, o.trace, o.offset_ns
        parent = set_span_in_context(span)
        for name, start, end in phases(trace):
            child = self._tracer.start_span(
                name, context=parent, kind=SpanKind.INTERNAL, start_time=start + off
            )
            if name == "prefill":
                child.set_attributes(_wait(metrics))
            child.end(end_time=end + off)
        span.set_attributes({**_answered_by(o.peer, trace), **_usage(trace, metrics)})
        if self.capture_content:
            span.set_attributes(_messages(o.request, trace))
        error = _error_type(trace)
        if error is not None:
            span.set_attribute("error.type", error)
            if trace.error is not None and trace.error.status is not None:
                span.set_attribute("http.response.status_code", trace.error.status)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=(trace.t_done or time.perf_counter_ns()) + off)

    def _record(
        self, common: dict[str, Any], error: str | None, metrics: Metrics, gaps: list[float]
    ) -> None:
        """The request's metric points (in the background thread), then send."""
        e2e = _seconds(metrics.e2e_ms)
        if e2e is not None:
            self._duration.record(e2e, {**common, **({"error.type": error} if error else {})})
        if error is None:  # the conventions count the tokens and chunks of answers only
            for kind, count in (
                ("input", _input_tokens(metrics)),
                ("output", _output_tokens(metrics)),
            ):
                if count is not None:
                    self._tokens.record(count, {**common, "gen_ai.token.type": kind})
            first = _seconds(metrics.ttft_ms)
            if first is not None:
                self._first_chunk.record(first, common)
            for gap in gaps:
                seconds = _seconds(gap)
                if seconds is not None:
                    self._per_chunk.record(seconds, common)
        self._send()

    # -- sending -----------------------------------------------------------------------
    def _note(self, line: str) -> None:
        if line not in self.notes:  # each exporter parses the headers: said once
            self.notes.append(line)

    def _refused(self) -> None:
        self.problem = (
            f"the OpenTelemetry collector at {collector()} refused the spans or metric "
            "points, or did not answer (the SDK retried; what it held is dropped)"
        )

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception as exc:  # one failed export must not stop the ones after it
                self.problem = f"{type(exc).__name__}: {exc}"

    def _after(self, job: Callable[[], None], wait_s: float | None) -> bool:
        """Run `job` in the background thread after what is queued; wait for it (at
        most `wait_s`): whether it finished."""
        done = threading.Event()

        def run() -> None:
            try:
                job()
            finally:
                done.set()

        self._jobs.put(run)
        return done.wait(wait_s)

    def flush(self) -> None:
        """Send everything now, once the background thread has recorded what it was
        given (tests; the app's exit is `close`)."""
        if not self._closed:
            self._after(self._send, None)

    def _send(self) -> None:
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """End any span still open (as cancelled), send everything and shut the SDK
        down, waiting at most `wait_s`: False when the collector did not take it all
        by then (what is left is dropped; the app's exit does not wait on it)."""
        if self._closed:
            return True
        for opened in list(self._open.values()):
            opened.trace.cancel()
            self.request_ended(opened.trace, compute(opened.trace))
        self._closed = True

        def shut() -> None:
            self.tracer_provider.shutdown()
            self.meter_provider.shutdown()

        finished = self._after(shut, wait_s)
        self._jobs.put(None)
        if not finished:
            self.dropped = self.problem = (
                f"the OpenTelemetry collector at {collector()} did not take the last spans "
                f"and metric points within {wait_s:g} s: they are dropped"
            )
        return finished


def phases(trace: Trace) -> list[tuple[str, int, int]]:
    """The request's phases as (name, start, end) on the recorder's clock: "queue" (it
    waited for a history summary before it was sent), "load" (for the model to load),
    "prefill" (ready -> first token: for a server, its queue, prefill and the network)
    and "decode" (first token -> last token). Only those that happened."""
    out: list[tuple[str, int, int]] = []
    sent, done = trace.t_sent, trace.t_done
    if trace.t_queued is not None and sent >= trace.t_queued:
        out.append(("queue", trace.t_queued, sent))
    ready = sent
    if trace.t_loading is not None and trace.t_loaded is not None:
        start = max(trace.t_loading, sent)
        if trace.t_loaded >= start:
            out.append(("load", start, trace.t_loaded))
            ready = trace.t_loaded
    first, last = trace.t_first_token, trace.t_last_token
    if first is not None and first >= ready:
        out.append(("prefill", ready, first))
        if last is not None and last >= first:
            out.append(("decode", first, last))
    elif done is not None and done >= ready:  # no token: the whole wait was prefill
        out.append(("prefill", ready, done))
    return out


def _histogram(meter: Any, name: str, unit: str, description: str) -> Histogram:
    buckets = TOKEN_BUCKETS if unit == "{token}" else SECONDS_BUCKETS
    histogram: Histogram = meter.create_histogram(
        name,
        unit=unit,
        description=description,
        explicit_bucket_boundaries_advisory=buckets,
    )
    return histogram


def _server(peer: Peer) -> dict[str, Any]:
    if peer.address is None:
        return {}
    return {"server.address": peer.address, "server.port": peer.port}


def _error_type(trace: Trace) -> str | None:
    """The error's kind (ours: low-cardinality, never a server's words), "cancelled"
    for a request the user stopped, None for an answer."""
    if trace.error is not None:
        return str(trace.error.kind)
    return "cancelled" if trace.finish == "cancelled" else None


def _seconds(ms: float | None) -> float | None:
    if ms is None or not math.isfinite(ms) or ms < 0:
        return None
    return ms / 1000


# The conventions count tokens the engine's tokenizer or the server's usage counted,
# never an estimate (their "offline token counting" is the user's choice, not ours).
def _input_tokens(metrics: Metrics) -> int | None:
    return None if metrics.prompt_tokens_source == "estimate" else metrics.prompt_tokens


def _output_tokens(metrics: Metrics) -> int | None:
    return None if metrics.output_tokens_estimated else metrics.output_tokens


def _wait(metrics: Metrics) -> dict[str, Any]:
    """A remote wait's waterfall (telemetry/waterfall.py) on the prefill span, one
    `phasechat.wait.*_ms` per part known: durations, not spans of their own, as the
    server says how long its parts took, never when they began. A part the server
    defines otherwise is keyed by its own name (Dynamo's
    `phasechat.wait.frontend_tokenize_route_ms`), its definition beside it (`.means`)."""
    fall = waterfall_of(metrics)
    if fall is None:
        return {}
    out: dict[str, Any] = {}
    for step in fall.steps:
        if step.ms is not None:
            out[f"phasechat.wait.{_slug(step.shown)}_ms"] = step.ms
        if step.means:
            out[f"phasechat.wait.{_slug(step.shown)}.means"] = step.means
    if fall.contradiction is not None:
        out["phasechat.wait.contradiction"] = fall.contradiction
    return out


def _slug(name: str) -> str:
    """A waterfall part's name as an attribute key's part, letters and digits joined by
    `_`: "server, other" is "server_other", "frontend: tokenize + route"
    "frontend_tokenize_route"."""
    return "_".join(re.findall(r"[a-z0-9]+", name.lower()))


def _answered_by(peer: Peer, trace: Trace) -> dict[str, str]:
    """`gen_ai.response.model` where it is known: the local model is the one loaded; a
    server names the model that answered in each chunk, which is not read (yet), and
    may differ from the one asked for (an alias, a dated version)."""
    return {"gen_ai.response.model": trace.model} if peer.address is None else {}


def _usage(trace: Trace, metrics: Metrics) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if trace.finish in ("stop", "length"):
        out["gen_ai.response.finish_reasons"] = [trace.finish]
    counted = {
        "gen_ai.usage.input_tokens": _input_tokens(metrics),
        "gen_ai.usage.output_tokens": _output_tokens(metrics),
        "gen_ai.usage.cache_read.input_tokens": metrics.cached_tokens,
    }
    if metrics.reasoning_tokens_source != "estimate":
        counted["gen_ai.usage.reasoning.output_tokens"] = metrics.reasoning_tokens
    out.update({k: v for k, v in counted.items() if v is not None and v >= 0})
    return out


def _messages(request: GenerationRequest, trace: Trace) -> dict[str, str]:
    """The prompt and the answer in the conventions' JSON shape (only when asked for)."""
    sent = [
        {"role": m.role, "parts": [{"type": "text", "content": m.content}]}
        for m in request.messages
    ]
    parts = [{"type": "text", "content": trace.text}]
    if trace.reasoning:
        parts.insert(0, {"type": "reasoning", "content": trace.reasoning})
    answer = {"role": "assistant", "parts": parts, "finish_reason": trace.finish or "error"}
    return {
        "gen_ai.input.messages": json.dumps(sent, ensure_ascii=False),
        "gen_ai.output.messages": json.dumps([answer], ensure_ascii=False),
    }
