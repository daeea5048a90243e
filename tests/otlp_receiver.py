"""An OTLP/HTTP receiver on 127.0.0.1 for the tracing tests: it takes what the SDK's
exporters POST to /v1/traces and /v1/metrics and decodes it with opentelemetry-proto,
so a test reads the spans and metric points exactly as a collector would get them."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value_of(v: AnyValue) -> Any:
    """An attribute's value as Python (a string, int, float, bool or list)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, kind) if kind is not None else None


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP key-values as a dict."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = value_of(kv.value)
    return out


@dataclass
class Receiver:
    """What arrived: each POST's raw body (to look for what must never be sent) and the
    decoded spans and metrics, with each one's resource attributes."""

    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    #: each POST's headers (names lower-cased)
    headers: list[dict[str, str]] = field(default_factory=list)
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metric_batches: list[ExportMetricsServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[Span]:
        with self.lock:
            return [
                span
                for request in self.traces
                for rs in request.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]

    def resources(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                attributes(rs.resource.attributes) for r in self.traces for rs in r.resource_spans
            ]

    def metrics(self) -> dict[str, Metric]:
        """Each metric by name, as last exported (cumulative: the last holds the totals)."""
        out: dict[str, Metric] = {}
        with self.lock:
            for request in self.metric_batches:
                for rm in request.resource_metrics:
                    for sm in rm.scope_metrics:
                        for metric in sm.metrics:
                            out[metric.name] = metric
        return out


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            reply: bytes
            with receiver.lock:
                receiver.bodies.append(body)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path == "/v1/traces":
                    receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                    reply = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver.metric_batches.append(ExportMetricsServiceRequest.FromString(body))
                    reply = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the test reads what arrived, not the access log

    return Handler


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver in a daemon thread; its `url` is the OTLP endpoint to export to."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits for the loop's next poll: 0.5 s by default, after every test
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
