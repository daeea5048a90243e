"""Each request as OpenTelemetry spans and metrics (telemetry/otel.py), received over
OTLP/HTTP by a receiver the test starts and decoded with opentelemetry-proto.

A turn on the bundled model and turns against a scripted server (and llama.cpp's own
llama-server, where it is built): the span tree, its times against the recorder's own
stamps, the attributes against the turn's own figures, the `traceparent` the server
received, the metrics with the conventions' names, units and buckets; and, without
`OTEL_EXPORTER_OTLP_ENDPOINT`, nothing at all.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from phasechat.backends.events import Event, Finished, GenerationRequest, StreamError, TextDelta
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.servers import FAMILIES
from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings, TrimConfig
from phasechat.chat.turns import Exchange
from phasechat.chat.workspace import Workspace
from phasechat.telemetry.otel import captures_content, enabled, peer_of, phases
from phasechat.telemetry.recorder import Trace
from tests.fault_server import FaultServer
from tests.otlp_receiver import Receiver, attributes
from tests.scripted import ScriptedBackend
from tests.vllm_server import VllmServer

# The conventions' ExplicitBucketBoundaries, copied from their text (gen-ai-metrics.md),
# not from the code under test.
SECONDS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216]
TOKENS.append(67108864)
CLIENT, INTERNAL = 3, 1  # opentelemetry.proto.trace.v1.Span.SpanKind
UNSET, ERROR = 0, 2  # Status.StatusCode
KEY = "sk-test-0123456789abcdef-never-sent"

#: the endpoints a server no listing owner names is asked, to tell which server it is
ASKED = sum(1 for family in FAMILIES if family.identify is not None)


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as s:
        yield s


def remote(base_url: str, model: str | None) -> BackendSpec:
    return BackendSpec("openai", remote=RemoteConfig(base_url=base_url, model=model))


async def one_turn(ws: Workspace, prompt: str) -> Exchange:
    async for _ in ws.turns.send(prompt):
        pass
    return ws.turns.exchanges[-1]


def tree(receiver: Receiver) -> tuple[Any, dict[str, Any]]:
    """The one request span and its children by name."""
    spans = receiver.spans()
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    children = {s.name: s for s in spans if s.parent_span_id}
    assert len(children) == len(spans) - 1, "two phases of one name"
    for child in children.values():
        assert child.parent_span_id == root.span_id and child.trace_id == root.trace_id
        assert child.kind == INTERNAL
    return root, children


def point(receiver: Receiver, name: str, **wanted: Any) -> Any:
    """The histogram point of metric `name` whose attributes include `wanted`."""
    found = [
        p
        for p in receiver.metrics()[name].histogram.data_points
        if wanted.items() <= attributes(p.attributes).items()
    ]
    assert len(found) == 1, (name, wanted)
    return found[0]


def in_its_bucket(p: Any, value: float) -> None:
    """One value recorded: its count sits in the bucket (lower, upper] that holds it."""
    assert list(p.explicit_bounds) == SECONDS
    assert p.count == 1 and sum(p.bucket_counts) == 1
    assert p.bucket_counts[bisect.bisect_left(SECONDS, value)] == 1


def checked_metrics(receiver: Receiver, trace: Trace, m: Any) -> None:
    """The four client metrics: names, units, bucket boundaries and the turn's values."""
    metrics = receiver.metrics()
    units = {name: metric.unit for name, metric in metrics.items()}
    assert units == {
        "gen_ai.client.operation.duration": "s",
        "gen_ai.client.token.usage": "{token}",
        "gen_ai.client.operation.time_to_first_chunk": "s",
        "gen_ai.client.operation.time_per_output_chunk": "s",
    }
    duration = point(
        receiver, "gen_ai.client.operation.duration", **{"gen_ai.operation.name": "chat"}
    )
    assert duration.sum == pytest.approx(m.e2e_ms / 1000, rel=1e-9)
    in_its_bucket(duration, m.e2e_ms / 1000)
    first = point(receiver, "gen_ai.client.operation.time_to_first_chunk")
    assert first.sum == pytest.approx(m.ttft_ms / 1000, rel=1e-9)
    in_its_bucket(first, m.ttft_ms / 1000)
    # one point per chunk after the first, each the gap since the one before
    gaps = [(b - a) / 1e9 for a, b in zip(trace.times, trace.times[1:], strict=False)]
    per_chunk = point(receiver, "gen_ai.client.operation.time_per_output_chunk")
    assert per_chunk.count == len(trace.times) - 1 == len(gaps) > 0
    assert per_chunk.sum == pytest.approx(sum(gaps), rel=1e-9)
    assert list(per_chunk.explicit_bounds) == SECONDS
    for kind, count in (("input", m.prompt_tokens), ("output", m.output_tokens)):
        tokens = point(receiver, "gen_ai.client.token.usage", **{"gen_ai.token.type": kind})
        assert list(tokens.explicit_bounds) == TOKENS
        assert (tokens.count, tokens.sum) == (1, count)
        assert tokens.bucket_counts[bisect.bisect_left(TOKENS, count)] == 1


def times_match(root: Any, children: dict[str, Any], trace: Trace) -> None:
    """The phases' times are the recorder's stamps (one offset to the wall clock for the
    whole request), never the moment the span was built."""
    prefill, decode = children["prefill"], children["decode"]
    assert prefill.start_time_unix_nano - root.start_time_unix_nano >= 0
    assert trace.t_first_token is not None and trace.t_last_token is not None
    assert trace.t_done is not None
    assert prefill.end_time_unix_nano - prefill.start_time_unix_nano == (
        trace.t_first_token - trace.t_sent
    )
    assert decode.start_time_unix_nano == prefill.end_time_unix_nano
    assert decode.end_time_unix_nano - decode.start_time_unix_nano == (
        trace.t_last_token - trace.t_first_token
    )
    assert root.end_time_unix_nano - prefill.start_time_unix_nano == trace.t_done - trace.t_sent


@pytest.mark.model
async def test_a_local_turn_is_a_genai_span_with_its_phases_and_the_client_metrics(
    local_backend: LocalBackend, otlp: Receiver
) -> None:
    settings = Settings(max_tokens=8, temperature=0.0, seed=7)
    ws = Workspace(Config(), BackendSpec(), settings=settings, backend=local_backend)
    assert ws.tracing is not None
    exchange = await one_turn(ws, "Name a colour.")
    await ws.aclose()  # flushes: nothing to wait for after it
    trace, m = exchange.trace, exchange.metrics
    assert m is not None and trace.finish in ("stop", "length") and m.output_tokens > 1

    root, children = tree(otlp)
    assert root.name == f"chat {local_backend.model}" and root.kind == CLIENT
    assert set(children) == {"prefill", "decode"}  # the model was loaded: no load phase
    assert root.status.code == UNSET
    a = attributes(root.attributes)
    assert a == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": local_backend.model,
        "gen_ai.response.model": local_backend.model,
        "gen_ai.request.max_tokens": 8,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.seed": 7,
        "gen_ai.response.finish_reasons": [trace.finish],
        "gen_ai.usage.input_tokens": m.prompt_tokens,
        "gen_ai.usage.output_tokens": m.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": m.cached_tokens,
    }  # no reasoning tokens: SmolLM2 does not think (None is never sent as a value)
    assert m.reasoning_tokens is None and m.cached_tokens is not None
    # the local engine counts with its tokenizer: the prompt is the templated chat
    assert m.prompt_tokens_source == "tokenizer"
    assert m.prompt_tokens is not None and m.prompt_tokens > 5
    times_match(root, children, trace)
    checked_metrics(otlp, trace, m)
    assert otlp.resources()[0]["service.name"] == "phasechat"
    everything = b"".join(otlp.bodies)
    assert b"Name a colour" not in everything and trace.text.encode() not in everything


async def test_a_remote_turn_sends_its_traceparent_and_names_the_server(
    otlp: Receiver, server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = Workspace(Config(), remote(server.base_url, "ok-5"), settings=Settings(max_tokens=9))
    await ws.backend.start()
    exchange = await one_turn(ws, "a private question")
    await ws.aclose()
    trace, m = exchange.trace, exchange.metrics
    assert m is not None and trace.error is None

    root, children = tree(otlp)
    assert root.name == "chat ok-5"
    a = attributes(root.attributes)
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == server.port
    assert a["gen_ai.provider.name"] == "openai"
    # the scripted server's usage: 5 prompt tokens, 5 completion tokens (ok-5)
    assert a["gen_ai.usage.input_tokens"] == 5 and a["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.usage.cache_read.input_tokens" not in a  # the server did not say
    assert a["gen_ai.request.max_tokens"] == 9
    assert "gen_ai.response.model" not in a  # the server's own name for it is not read
    times_match(root, children, trace)
    checked_metrics(otlp, trace, m)
    # The wait's waterfall on the prefill span: no server account here, so what is not
    # the connection and the request's writing is the rest (ttft - body sent, by hand).
    wait = attributes(children["prefill"].attributes)
    assert m.connect_ms is not None and m.sent_ms is not None and m.ttft_ms is not None
    assert wait["phasechat.wait.connect_ms"] == m.connect_ms
    assert wait["phasechat.wait.the_rest_ms"] == pytest.approx(m.ttft_ms - m.sent_ms, abs=1e-9)
    assert wait["phasechat.wait.request_sent_ms"] == pytest.approx(m.sent_ms - m.connect_ms)
    assert not any(k.startswith("phasechat.wait.queued") for k in wait)
    assert attributes(children["decode"].attributes) == {}

    # The chat request carried the span's W3C context (the model listing did not, nor
    # the questions of which server it is: backends/remote/servers identify).
    chat = [h for h in server.headers if "traceparent" in h]
    assert len(chat) == 1 and len(server.headers) == 2 + ASKED
    version, trace_id, parent_id, flags = chat[0]["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", root.trace_id.hex(), root.span_id.hex())
    assert int(flags, 16) & 1  # sampled (the SDK also sets W3C level 2's "random" bit)
    assert chat[0]["authorization"] == f"Bearer {KEY}"
    assert ws.tracing is not None and ws.tracing.headers() == {}  # no request under way
    everything = b"".join(otlp.bodies)
    assert KEY.encode() not in everything and KEY[:12].encode() not in everything
    assert b"a private question" not in everything


async def test_a_failed_turn_ends_its_span_in_error_without_the_servers_words(
    otlp: Receiver, server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server refuses with a 401 whose body quotes the key it was sent.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = Workspace(Config(), remote(server.base_url, "echokey"))
    await ws.backend.start()
    failed = await one_turn(ws, "first")
    await ws.aclose()
    error = failed.trace.error
    assert error is not None and error.status == 401

    root, children = tree(otlp)
    assert root.status.code == ERROR and root.status.message == error.kind
    a = attributes(root.attributes)
    assert a["error.type"] == error.kind and a["http.response.status_code"] == 401
    assert set(children) == {"prefill"}  # no token: the whole wait
    assert "gen_ai.usage.output_tokens" not in a  # nothing was counted
    (duration,) = otlp.metrics()["gen_ai.client.operation.duration"].histogram.data_points
    assert attributes(duration.attributes)["error.type"] == error.kind
    assert "gen_ai.client.token.usage" not in otlp.metrics()  # no answer, no usage
    everything = b"".join(otlp.bodies)
    assert KEY.encode() not in everything and KEY[:12].encode() not in everything
    assert b"invalid credentials" not in everything


async def test_a_stopped_turn_ends_its_span_cancelled(otlp: Receiver, server: FaultServer) -> None:
    ws = Workspace(Config(), remote(server.base_url, "ok-400"), settings=Settings(max_tokens=500))
    await ws.backend.start()
    stream = ws.turns.send("a long one")
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    await stream.aclose()
    await ws.aclose()
    stopped = ws.turns.exchanges[-1]
    assert stopped.trace.finish == "cancelled" and stopped.trace.t_done is not None

    root, children = tree(otlp)
    assert root.status.code == ERROR and root.status.message == "cancelled"
    assert attributes(root.attributes)["error.type"] == "cancelled"
    assert set(children) == {"prefill", "decode"}
    assert root.end_time_unix_nano - children["prefill"].start_time_unix_nano == (
        stopped.trace.t_done - stopped.trace.t_sent
    )


async def test_the_messages_are_in_the_span_only_when_asked_for(
    otlp: Receiver, server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    settings = Settings(system="Be brief.", max_tokens=9)
    ws = Workspace(Config(), remote(server.base_url, "ok-3"), settings=settings)
    await ws.backend.start()
    exchange = await one_turn(ws, "what is asked")
    await ws.aclose()
    root, _ = tree(otlp)
    a = attributes(root.attributes)
    assert json.loads(a["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "what is asked"}]},
    ]
    assert json.loads(a["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "tok tok tok "}],
            "finish_reason": "stop",
        }
    ]
    assert exchange.trace.text == "tok tok tok "


async def test_without_the_endpoint_nothing_is_set_up_and_no_traceparent_is_sent(
    server: FaultServer,
) -> None:
    ws = Workspace(Config(), remote(server.base_url, "ok-3"))
    assert ws.tracing is None
    await ws.backend.start()
    await one_turn(ws, "hello")
    await ws.aclose()
    assert len(server.headers) == 2 + ASKED
    assert not any("traceparent" in h for h in server.headers)


def test_without_the_endpoint_the_sdk_is_not_even_imported() -> None:
    code = (
        "import sys\n"
        "from phasechat.chat.config.file import Config\n"
        "from phasechat.chat.config.profiles import BackendSpec\n"
        "from phasechat.backends.remote.backend import RemoteConfig\n"
        "from phasechat.chat.workspace import Workspace\n"
        "ws = Workspace(Config(), BackendSpec('openai', remote=RemoteConfig()))\n"
        "assert ws.tracing is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    # and with it set, the same lines set the SDK up (the check above can fail)
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    env["OTEL_SDK_DISABLED"] = "false"
    out = subprocess.run(
        [sys.executable, "-c", code.replace("is None", "is not None")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "opentelemetry.sdk.trace" in out.stdout


@pytest.mark.server
async def test_a_turn_on_llama_server_carries_the_servers_own_counts(
    otlp: Receiver, real_llama_server: str
) -> None:
    ws = Workspace(Config(), remote(real_llama_server, None), settings=Settings(max_tokens=8))
    await ws.backend.start()
    await one_turn(ws, "Name a colour.")
    exchange = await one_turn(ws, "And another one.")  # its history is in the cache
    await ws.aclose()
    trace, m = exchange.trace, exchange.metrics
    assert m is not None and m.prompt_tokens_source == "server"
    assert m.cached_tokens is not None  # llama-server says (0 when another slot answered)
    spans = otlp.spans()
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 2
    root = max(roots, key=lambda s: s.start_time_unix_nano)  # the second turn's
    children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    a = attributes(root.attributes)
    assert a["gen_ai.usage.input_tokens"] == m.prompt_tokens
    assert a["gen_ai.usage.cache_read.input_tokens"] == m.cached_tokens
    assert a["gen_ai.usage.output_tokens"] == m.output_tokens
    assert a["server.port"] == int(real_llama_server.rsplit(":", 1)[1].split("/")[0])
    times_match(root, children, trace)
    # llama-server's own prefill time (its `timings`) in the wait's waterfall; on a
    # loaded machine the client may stamp the body's end after the server began, and
    # the waterfall then names a contradiction instead of a part it cannot place
    assert m.server_prompt_ms is not None and m.server_prompt_ms > 0
    wait = attributes(children["prefill"].attributes)
    if "phasechat.wait.contradiction" in wait:
        assert "phasechat.wait.prefill_ms" not in wait
    else:
        assert wait["phasechat.wait.prefill_ms"] == m.server_prompt_ms


@pytest.mark.server
async def test_vllm_nests_its_own_span_under_the_turns_span(
    otlp: Receiver, vllm_per_request: VllmServer, vllm_spans: Receiver
) -> None:
    # vLLM exports its request span over OTLP/HTTP as well, to a receiver of the run's
    # (the server is shared with test_family_vllm.py: one start less)
    vllm = vllm_per_request
    ws = Workspace(Config(), remote(vllm.base_url, None), settings=Settings(max_tokens=6))
    await ws.backend.start()
    exchange = await one_turn(ws, "Name a colour.")
    await ws.aclose()
    ours = next(s for s in otlp.spans() if s.name.startswith("chat "))
    # vLLM's batch processor sends when it likes: wait for its span (not a timing test)
    deadline = time.monotonic() + 60
    while not (
        theirs := [
            s for s in vllm_spans.spans() if s.parent_span_id == ours.span_id and s.kind != INTERNAL
        ]
    ):
        assert time.monotonic() < deadline, [s.name for s in vllm_spans.spans()]
        await asyncio.sleep(0.2)
    assert theirs[0].name == "llm_request" and theirs[0].trace_id == ours.trace_id
    a = attributes(theirs[0].attributes)
    assert a["gen_ai.request.max_tokens"] == 6
    # the server's own time to first token lies inside ours (the network, around it)
    m = exchange.metrics
    assert m is not None and m.ttft_ms is not None
    assert 0 < a["gen_ai.latency.time_to_first_token"] <= m.ttft_ms / 1000


def test_the_phases_are_the_recorders_stamps() -> None:
    # Waited 100 ns for a summary, sent at 100, the model loaded from 150 to 400, first
    # token at 1000, last at 1900, done at 2000.
    t = Trace("b", "m", t_queued=0, t_sent=100, t_loading=150, t_loaded=400)
    t.t_first_token, t.t_last_token, t.t_done = 1000, 1900, 2000
    assert phases(t) == [
        ("queue", 0, 100),
        ("load", 150, 400),
        ("prefill", 400, 1000),
        ("decode", 1000, 1900),
    ]
    # No token (a refusal): the whole wait from the send is prefill; no load phase.
    t = Trace("b", "m", t_sent=100)
    t.t_done = 700
    assert phases(t) == [("prefill", 100, 700)]


def test_the_switches_read_as_the_sdk_and_the_conventions_read_them() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert enabled(endpoint) and not enabled({})
    assert not enabled({**endpoint, "OTEL_SDK_DISABLED": "TRUE"})
    assert enabled({**endpoint, "OTEL_SDK_DISABLED": "false"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    key = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    for value in ("true", "True", "SPAN_ONLY", "span_and_event"):
        assert captures_content({key: value}), value
    for value in ("", "false", "NO_CONTENT", "EVENT_ONLY", "yes please"):
        assert not captures_content({key: value}), value


class Refusing(ScriptedBackend):
    """Refuses the third turn's first request (six messages) as longer than its window,
    once; the trimmer then summarizes the history and the turn is sent again."""

    refused = False

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if len(request.messages) >= 6 and not self.refused:
            self.refused = True
            yield StreamError("context_overflow", "too long", detail={"n_ctx": 200})
            return
        async for event in super().stream(request, every_s=every_s):
            yield event


async def test_a_turn_refused_as_too_long_and_sent_again_is_two_spans(otlp: Receiver) -> None:
    backend = Refusing(text="a b c")
    config = Config(trim=TrimConfig(keep_last=1))
    ws = Workspace(config, BackendSpec(), settings=Settings(max_tokens=8), backend=backend)
    for prompt in ("one", "two", "three"):
        exchange = await one_turn(ws, prompt)
    assert ws.tracing is not None
    ws.tracing.flush()  # not closed yet: every request's span ended when it did
    assert backend.refused and exchange.answer.status == "complete"
    assert any("refused the prompt" in n for n in exchange.trace.notices)

    roots = sorted(
        (s for s in otlp.spans() if not s.parent_span_id), key=lambda s: s.start_time_unix_nano
    )
    assert [r.status.code for r in roots] == [UNSET, UNSET, ERROR, UNSET]
    assert attributes(roots[2].attributes)["error.type"] == "context_overflow"
    assert roots[2].end_time_unix_nano <= roots[3].start_time_unix_nano
    await ws.aclose()


async def test_closing_gives_up_on_a_collector_that_does_not_answer(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on the discard port: every export is refused and retried.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    ws = Workspace(Config(), remote(server.base_url, "ok-3"))
    await ws.backend.start()
    await one_turn(ws, "hello")
    assert ws.tracing is not None
    assert ws.tracing.close(wait_s=0.2) is False  # what was pending is dropped
    assert ws.tracing.close() is True  # closed already: nothing left to wait for
    await ws.aclose()


def test_a_misspelt_propagator_stops_the_start_in_one_line() -> None:
    # The SDK reads OTEL_PROPAGATORS when its propagation module is first imported, and
    # raises there: `ask` says so at the start, not in the middle of every request.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    env["OTEL_PROPAGATORS"] = "tracecontxt"
    args = ["--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "ask", "hi"]
    r = subprocess.run(
        [sys.executable, "-m", "phasechat", *args], env=env, capture_output=True, text=True
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "OTEL_PROPAGATORS: Propagator tracecontxt not found" in lines[0]


async def test_a_failed_send_does_not_stop_the_ones_after_it(
    otlp: Receiver, server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = Workspace(Config(), remote(server.base_url, "ok-3"))
    await ws.backend.start()
    assert ws.tracing is not None
    flush = ws.tracing.tracer_provider.force_flush
    broken = {"once": True}

    def fails_once(timeout_millis: int = 30000) -> bool:
        if broken.pop("once", False):
            raise RuntimeError("exporter bug")
        return flush(timeout_millis)

    monkeypatch.setattr(ws.tracing.tracer_provider, "force_flush", fails_once)
    await one_turn(ws, "one")  # its sending fails in the background thread
    await one_turn(ws, "two")
    ws.tracing.flush()
    assert ws.tracing.problem == "RuntimeError: exporter bug"
    assert len([s for s in otlp.spans() if not s.parent_span_id]) == 2
    await ws.aclose()


async def test_a_collector_that_refuses_is_said_without_its_credentials(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the discard port: after the SDK's retries (1 s here) the
    exporter says which collector did not take the batch, with no password in it."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:s3cret-pw@127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    ws = Workspace(Config(), remote(server.base_url, "ok-3"))
    await ws.backend.start()
    assert ws.tracing is not None and ws.tracing.problem is None
    await one_turn(ws, "hello")
    await asyncio.to_thread(ws.tracing.flush)
    problem = ws.tracing.problem
    assert problem is not None and "collector at http://" in problem
    assert "127.0.0.1:9 refused the spans or metric points" in problem
    assert "s3cret-pw" not in problem
    await ws.aclose()


def test_ask_warns_of_a_collector_that_refuses() -> None:
    from tests.fault_server import fault_server_thread

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
    with fault_server_thread() as server:
        args = ["--backend", "openai", "--base-url", server.base_url, "--model", "ok-3"]
        r = subprocess.run(
            [sys.executable, "-m", "phasechat", *args, "ask", "--no-save", "hi"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    (line,) = r.stderr.strip().splitlines()  # the SDK's own retries and failures: quiet
    assert line.startswith("phasechat: warning: the OpenTelemetry collector at http://127.0.0.1:9")


async def test_the_app_says_once_that_the_collector_refuses(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phasechat.chat.config.settings import Settings
    from phasechat.tui.app import TRACING_CHECK_S, PhasechatApp
    from tests.helpers import wait_for

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="ok-3"))
    app = PhasechatApp(settings=Settings(), backend=backend)

    told: list[str] = []
    notify = app.notify

    def said() -> list[str]:
        return [line for line in told if "collector" in line]

    def recorded(message: str, **kwargs: Any) -> None:
        told.append(message)  # every toast, also those gone from the screen since
        notify(message, **kwargs)

    monkeypatch.setattr(app, "notify", recorded)

    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: backend.state == "ready")
        app.chat.send("hi")
        await wait_for(pilot, lambda: bool(said()))
        await pilot.pause(3 * TRACING_CHECK_S)  # later checks find the same problem
        (line,) = said()
        assert line.startswith("the OpenTelemetry collector at http://127.0.0.1:9 refused")
    await backend.aclose()


def test_the_server_port_is_the_schemes_default_where_the_url_names_none() -> None:
    """Issue 49: https without a port is 443, http 80, a port given is that port."""

    def port(url: str) -> int | None:
        return peer_of(RemoteBackend(RemoteConfig(base_url=url))).port

    assert port("https://api.example.com/v1") == 443
    assert port("http://api.example.com/v1") == 80
    assert port("https://127.0.0.1:8443/v1") == 8443
    assert peer_of(RemoteBackend(RemoteConfig(base_url="https://h/v1"))).address == "h"


class Stamped(ScriptedBackend):
    """Three chunks, the first two made in the same nanosecond (a gap of 0 ms, as two
    events of one network read), the third 30 ms later."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        now = time.perf_counter_ns()
        for i, at in enumerate((now, now, now + 30_000_000)):
            yield TextDelta(f"w{i} ", t_ns=at)
        yield Finished("stop")


async def test_a_chunk_gap_of_zero_is_a_point_of_the_per_chunk_histogram(otlp: Receiver) -> None:
    ws = Workspace(Config(), BackendSpec(), settings=Settings(), backend=Stamped())
    exchange = await one_turn(ws, "Hi")
    await ws.aclose()
    assert exchange.metrics is not None
    per_chunk = point(otlp, "gen_ai.client.operation.time_per_output_chunk")
    assert per_chunk.count == 2 and per_chunk.sum == pytest.approx(0.03)
    # the 0 s gap in the first bucket (<= 0.01 s), the 30 ms one in (0.02, 0.04]
    assert list(per_chunk.bucket_counts[:3]) == [1, 0, 1]
