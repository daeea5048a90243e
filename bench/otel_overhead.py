"""What OpenTelemetry tracing (telemetry/otel.py) costs, side by side in one run.

1. Start-up: a fresh interpreter imports the workspace and asks `otel.from_env()`, with
   `OTEL_EXPORTER_OTLP_ENDPOINT` unset (nothing of the SDK imported) and set (the SDK,
   its exporters and providers built); the runs interleaved, medians compared.
2. Each request's end on the event loop: `request_sent` + `request_ended` (the span tree,
   the metric points; the export itself runs in the SDK's threads) for a synthetic
   answer of `--tokens` token events, beside `metrics.compute` of the same trace (the
   work every request's end already does), exporting to a receiver on 127.0.0.1.

    .venv/bin/python -m bench.otel_overhead [--starts 7] [--requests 200] [--tokens 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from phasechat.backends.events import Finished, GenerationRequest, Message, TextDelta, Usage
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.telemetry import otel
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace
from tests.otlp_receiver import otlp_receiver

START = (
    "import time; t = time.perf_counter()\n"
    "from phasechat.chat.workspace import Workspace\n"
    "from phasechat.telemetry import otel\n"
    "exporter = otel.from_env()\n"
    "print((time.perf_counter() - t) * 1000)\n"
)


def start_ms(env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", START], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def answer(tokens: int) -> Trace:
    """A finished trace: sent at 0, a token every 20 ms after a 300 ms prefill."""
    trace = Trace("remote", "m", max_tokens=tokens)
    trace.t_sent = sent = time.perf_counter_ns()
    t = sent
    for i in range(tokens):
        t = sent + 300_000_000 + i * 20_000_000
        trace.observe(TextDelta("tok ", tokens=1, t_ns=t), t)
    trace.observe(Usage(prompt_tokens=12, completion_tokens=tokens), t)
    trace.observe(Finished("stop", t_ns=t), t)
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()

    with otlp_receiver() as receiver:
        off = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        on = {**off, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        unset, setup = [], []
        for _ in range(args.starts):
            unset.append(start_ms(off))
            setup.append(start_ms(on))
        a, b = statistics.median(unset), statistics.median(setup)
        print(f"start-up, import + from_env: unset {a:.1f} ms, set {b:.1f} ms ({b / a:.2f}x)")

        os.environ.update(on)  # the exporters read their endpoint from it
        exporter = otel.TurnExporter()
        backend = RemoteBackend(RemoteConfig(base_url="http://127.0.0.1:8080/v1"))
        request = GenerationRequest((Message("user", "hi"),), max_tokens=args.tokens)
        traced, computed = [], []
        for _ in range(args.requests):
            trace = answer(args.tokens)
            t0 = time.perf_counter_ns()
            metrics = compute(trace)
            t1 = time.perf_counter_ns()
            exporter.request_sent(trace, request, backend)
            exporter.request_ended(trace, metrics)
            t2 = time.perf_counter_ns()
            computed.append((t1 - t0) / 1e6)
            traced.append((t2 - t1) / 1e6)
        t3 = time.perf_counter()
        exporter.flush()
        closed = (time.perf_counter() - t3) * 1000
        exporter.close()
        c, t = statistics.median(computed), statistics.median(traced)
        print(
            f"a request's end, {args.tokens} tokens: metrics {c:.2f} ms, "
            f"spans + metric points {t:.2f} ms ({t / c:.2f}x the metrics)"
        )
        print(f"then the background thread's recording and sending: {closed:.0f} ms")
        print(f"received: {len(receiver.spans())} spans")


if __name__ == "__main__":
    main()
