"""OpenTelemetry's view of a request at its edges (telemetry/otel.py; issue 49, item 3):
phases at each bound and one past it, the SDK's warnings in our words, the collector as
it may be shown, and a turn's attributes that the other tests' turns leave unset (stop
sequences, a length finish, a thinking answer, the service's own name), received by the
OTLP receiver."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    ReasoningDelta,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.workspace import Workspace
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.otel import TurnExporter, collector, enabled, phases, sdk_line
from phasechat.telemetry.recorder import Trace
from tests.otlp_receiver import Receiver, attributes
from tests.scripted import ScriptedBackend


def trace(**stamps: int | None) -> Trace:
    t = Trace("b", "m", t_sent=100)
    for name, value in stamps.items():
        setattr(t, name, value)
    return t


@pytest.mark.parametrize(
    ("stamps", "want"),
    [
        # a wait of no time for a summary is still a queue phase; one "after" the send none
        ({"t_queued": 100, "t_done": 300}, [("queue", 100, 100), ("prefill", 100, 300)]),
        ({"t_queued": 101, "t_done": 300}, [("prefill", 100, 300)]),
        # a load that began before the send is counted from the send
        (
            {"t_loading": 50, "t_loaded": 400, "t_done": 500},
            [("load", 100, 400), ("prefill", 400, 500)],
        ),
        # a load that ended at the send is one of no time; one that ended before, none
        (
            {"t_loading": 50, "t_loaded": 100, "t_done": 500},
            [("load", 100, 100), ("prefill", 100, 500)],
        ),
        ({"t_loading": 50, "t_loaded": 99, "t_done": 500}, [("prefill", 100, 500)]),
        ({"t_loading": 150, "t_loaded": None, "t_done": 500}, [("prefill", 100, 500)]),
        # the first token at the moment the model was ready, the last at the first
        (
            {"t_loading": 100, "t_loaded": 400, "t_first_token": 400, "t_last_token": 400},
            [("load", 100, 400), ("prefill", 400, 400), ("decode", 400, 400)],
        ),
        ({"t_first_token": 300, "t_last_token": 299}, [("prefill", 100, 300)]),
        # a token stamped before the send (no clock does this): the wait up to the end
        ({"t_first_token": 99, "t_done": 700}, [("prefill", 100, 700)]),
        # no token, done at the send: a prefill of no time; done before it: nothing
        ({"t_done": 100}, [("prefill", 100, 100)]),
        ({"t_done": 99}, []),
        ({}, []),
    ],
)
def test_each_phase_at_its_bound_and_one_past_it(
    stamps: dict[str, int | None], want: list[tuple[str, int, int]]
) -> None:
    assert phases(trace(**stamps)) == want


def record(msg: str, name: str = "opentelemetry.exporter.otlp", level: int = 30) -> str:
    return sdk_line(logging.LogRecord(name, level, "x.py", 1, msg, ("Bearer s3cret",), None))


def test_the_sdk_s_warnings_are_said_in_our_words_and_never_its_arguments() -> None:
    assert record("Header format invalid! Header values ...: %s") == (
        "OTEL_EXPORTER_OTLP_HEADERS (or a per-signal ..._HEADERS): a header that is "
        "not name=value, URL-encoded, is left out (not shown: it may hold a token)"
    )
    assert record("Couldn't recognize sampler %s.") == (
        "OTEL_TRACES_SAMPLER names no sampler the OpenTelemetry SDK knows: its default "
        "(parentbased_always_on) is used"
    )
    assert record("Could not convert TRACES_SAMPLER_ARG to float. Using default value 1.0.") == (
        "OTEL_TRACES_SAMPLER_ARG is not a number: the sampler's rate is 1.0"
    )
    # the words must open the message: the same words inside another say nothing of it
    assert record("Retrying: Header format invalid %s", level=40) == (
        "the OpenTelemetry SDK warned (opentelemetry.exporter.otlp, error); its words are "
        "not shown, as they may quote a header"
    )


def test_the_collector_is_the_traces_endpoint_first_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert collector() == "http://localhost:4318"  # the SDK's default
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", " http://u:pw@otel.example:4318 ")
    assert collector() == "http://u:…redacted@otel.example:4318"  # no password
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://traces.example/v1/traces")
    assert collector() == "https://traces.example/v1/traces"


def test_the_sdk_is_disabled_by_true_in_any_case_and_spacing() -> None:
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not enabled({**on, "OTEL_SDK_DISABLED": " True "})
    assert enabled({**on, "OTEL_SDK_DISABLED": "yes"})


# -- a turn's attributes --------------------------------------------------------------


class Thinking(ScriptedBackend):
    """An answer that thinks first, then stops at its length."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield ReasoningDelta("weighing it")
        yield TextDelta("blue")
        yield Finished("length")


async def one_turn(ws: Workspace, prompt: str) -> Trace:
    async for _ in ws.turns.send(prompt):
        pass
    return ws.turns.exchanges[-1].trace


async def test_stop_sequences_a_length_finish_and_the_thinking_are_in_the_span(
    otlp: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    settings = Settings(max_tokens=2, stop=("\n\n", "END"))
    ws = Workspace(Config(), BackendSpec(), settings=settings, backend=Thinking())
    t = await one_turn(ws, "a colour?")
    await ws.aclose()
    (root,) = [s for s in otlp.spans() if not s.parent_span_id]
    a = attributes(root.attributes)
    assert a["gen_ai.request.stop_sequences"] == ["\n\n", "END"]
    assert "gen_ai.request.seed" not in a  # none was set
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    # no usage from the backend: the counts are estimates, which the conventions leave out
    assert not [k for k in a if k.startswith("gen_ai.usage.")]
    assert json.loads(a["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "weighing it"},
                {"type": "text", "content": "blue"},
            ],
            "finish_reason": "length",
        }
    ]
    assert t.text == "blue"


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"OTEL_SERVICE_NAME": "my-chat"}, "my-chat"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "team=x,service.name=desk"}, "desk"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "team=x"}, "phasechat"),
    ],
)
async def test_the_service_is_named_by_the_sdk_s_variables_or_else_phasechat(
    otlp: Receiver, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], name: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ws = Workspace(Config(), BackendSpec(), settings=Settings(), backend=ScriptedBackend())
    await one_turn(ws, "hi")
    await ws.aclose()
    assert otlp.resources()[0]["service.name"] == name


class FailsMidway(ScriptedBackend):
    """Says a word, then the server fails: an answer with no finish of its own."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield TextDelta("café ")
        yield StreamError("server", "the server fell over")


async def test_a_failed_answer_s_messages_say_error_and_keep_their_letters(
    otlp: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed answer's finish reason is "error"; the messages are the text as typed
    (a collector shows "naïve", not "na\\u00efve")."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    ws = Workspace(Config(), BackendSpec(), settings=Settings(), backend=FailsMidway())
    t = await one_turn(ws, "naïve?")
    await ws.aclose()
    assert t.error is not None and t.finish == "error"
    (root,) = [s for s in otlp.spans() if not s.parent_span_id]
    a = attributes(root.attributes)
    assert '"naïve?"' in a["gen_ai.input.messages"]
    assert '"café "' in a["gen_ai.output.messages"]
    (answer,) = json.loads(a["gen_ai.output.messages"])
    assert answer["finish_reason"] == "error"
    assert answer["parts"] == [{"type": "text", "content": "café "}]


async def test_an_exporter_made_without_the_switch_leaves_the_messages_out(
    otlp: Receiver,
) -> None:
    """`TurnExporter()` (as bench/otel_overhead.py makes it): no prompt in the span."""
    exporter = TurnExporter()
    t = Trace("scripted", "m", t_sent=time.perf_counter_ns())
    request = GenerationRequest(messages=(Message("user", "a secret question"),))
    exporter.request_sent(t, request, ScriptedBackend())
    t.t_done = time.perf_counter_ns()
    exporter.request_ended(t, compute(t))
    assert exporter.close(wait_s=30)
    (root,) = [s for s in otlp.spans() if not s.parent_span_id]
    assert root.name == "chat m"
    assert not any(k.startswith("gen_ai.input") for k in attributes(root.attributes))
    assert b"a secret question" not in b"".join(otlp.bodies)


def test_the_sdk_s_log_records_become_our_notes_once_and_reach_no_other_handler(
    otlp: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """What the SDK logs is a note in our words, each once; and no record goes on to
    the root logger's handlers (Python's last resort printed them to stderr, a header's
    token with them)."""
    exporter = TurnExporter()
    sdk = logging.getLogger("opentelemetry.util.re")  # where the SDK parses headers
    sdk.warning("Header format invalid! Header values must be URL encoded: %s", "Bearer s3cret")
    sdk.warning("Header format invalid! Header values must be URL encoded: %s", "Bearer s3cret")
    logging.getLogger("opentelemetry.sdk.trace").warning("Couldn't recognize sampler %s.", "x")
    assert exporter.notes == [
        "OTEL_EXPORTER_OTLP_HEADERS (or a per-signal ..._HEADERS): a header that is "
        "not name=value, URL-encoded, is left out (not shown: it may hold a token)",
        "OTEL_TRACES_SAMPLER names no sampler the OpenTelemetry SDK knows: its default "
        "(parentbased_always_on) is used",
    ]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]
    assert exporter.close(wait_s=30)


def test_a_misspelt_propagator_is_named_when_the_exporter_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK reads OTEL_PROPAGATORS when its propagation module is first imported:
    made afresh here, the error names the variable and the propagator."""
    import opentelemetry

    monkeypatch.delitem(sys.modules, "opentelemetry.propagate", raising=False)
    monkeypatch.delattr(opentelemetry, "propagate", raising=False)
    monkeypatch.setenv("OTEL_PROPAGATORS", "tracecontxt")
    with pytest.raises(ValueError, match=r"^OTEL_PROPAGATORS: Propagator tracecontxt not found"):
        TurnExporter()


async def test_a_collector_that_answers_404_is_said_at_once_without_its_password(
    otlp: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that refuses outright (no retry for a 404) is said by the URL it may
    be shown by, once the batch was refused."""
    endpoint = otlp.url.replace("http://", "http://otel:s3cret-pw@") + "/elsewhere"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    ws = Workspace(Config(), BackendSpec(), settings=Settings(), backend=ScriptedBackend())
    assert ws.tracing is not None and ws.tracing.problem is None
    await one_turn(ws, "hi")
    ws.tracing.flush()
    shown = otlp.url.replace("http://", "http://otel:…redacted@") + "/elsewhere"
    assert ws.tracing.problem == (
        f"the OpenTelemetry collector at {shown} refused the spans or metric points, or "
        "did not answer (the SDK retried; what it held is dropped)"
    )
    assert ws.tracing.notes == []  # the exporter's own failure logs are not notes: said once
    await ws.aclose()
    assert otlp.spans() == []


async def test_a_request_s_span_is_a_client_span_from_its_wait_on_the_wall_clock(
    otlp: Receiver,
) -> None:
    """The span begins when the request began waiting (its queue phase), at the wall
    clock's time, and names what was asked, each attribute by the conventions' name."""
    exporter = TurnExporter()
    before = time.time_ns()
    sent = time.perf_counter_ns()
    t = Trace("scripted", "m-7", t_queued=sent - 5_000_000, t_sent=sent)
    request = GenerationRequest(
        messages=(Message("user", "hi"),), max_tokens=5, temperature=0.3, seed=11
    )
    exporter.request_sent(t, request, ScriptedBackend())
    t.t_done = sent + 2_000_000
    exporter.request_ended(t, compute(t))
    assert exporter.close(wait_s=30)
    after = time.time_ns()
    (root,) = [s for s in otlp.spans() if not s.parent_span_id]
    children = {s.name: s for s in otlp.spans() if s.parent_span_id}
    assert root.kind == 3  # SpanKind.CLIENT in opentelemetry.proto
    assert root.start_time_unix_nano == children["queue"].start_time_unix_nano
    assert root.end_time_unix_nano - root.start_time_unix_nano == 7_000_000
    assert before - 5_000_000 <= root.start_time_unix_nano <= after
    assert attributes(root.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "m-7",
        "gen_ai.response.model": "m-7",
        "gen_ai.request.max_tokens": 5,
        "gen_ai.request.temperature": 0.3,
        "gen_ai.request.seed": 11,
    }


def test_the_end_of_a_request_never_sent_is_nothing(otlp: Receiver) -> None:
    exporter = TurnExporter()
    t = Trace("scripted", "m", t_sent=time.perf_counter_ns())
    t.cancel()
    exporter.request_ended(t, compute(t))
    assert exporter.close(wait_s=30)
    assert otlp.spans() == []


class Counted(ScriptedBackend):
    """Thinks, answers in two chunks 20 ms apart, and counts its own tokens (none of
    the prompt cached), as a server's usage does."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        now = time.perf_counter_ns()
        yield ReasoningDelta("hm", t_ns=now)
        yield TextDelta("blue", t_ns=now + 20_000_000)
        yield Usage(prompt_tokens=12, completion_tokens=7, cached_tokens=0, reasoning_tokens=3)
        yield Finished("stop")


async def test_a_counted_answer_s_usage_and_each_metric_point_s_attributes(
    otlp: Receiver,
) -> None:
    """The backend's own counts, a cached count of 0 among them, on the span; every
    metric point carries the request's attributes (a collector groups by them)."""
    ws = Workspace(Config(), BackendSpec(), settings=Settings(), backend=Counted())
    t = await one_turn(ws, "a colour?")
    await ws.aclose()
    (root,) = [s for s in otlp.spans() if not s.parent_span_id]
    a = attributes(root.attributes)
    assert {k: v for k, v in a.items() if k.startswith("gen_ai.u")} == {
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "gen_ai.usage.reasoning.output_tokens": 3,
    }
    assert a["gen_ai.response.finish_reasons"] == ["stop"] and t.finish == "stop"
    request = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "scripted-model",
        "gen_ai.response.model": "scripted-model",
    }
    metrics = otlp.metrics()
    for name in (
        "gen_ai.client.operation.duration",
        "gen_ai.client.operation.time_to_first_chunk",
        "gen_ai.client.operation.time_per_output_chunk",
    ):
        (p,) = metrics[name].histogram.data_points
        assert attributes(p.attributes) == request, name
    # the conventions' descriptions, copied from gen-ai-metrics.md, not from the code
    assert {name: metric.description for name, metric in metrics.items()} == {
        "gen_ai.client.operation.duration": "GenAI operation duration.",
        "gen_ai.client.token.usage": "Number of input and output tokens used.",
        "gen_ai.client.operation.time_to_first_chunk": "Time to receive the first chunk.",
        "gen_ai.client.operation.time_per_output_chunk": (
            "Time per output chunk after the first one."
        ),
    }
    # the instrumentation scope is phasechat's, and so is the metrics' resource
    scopes = {
        ss.scope.name for r in otlp.traces for rs in r.resource_spans for ss in rs.scope_spans
    }
    assert scopes == {"phasechat"}
    batches = [rm for r in otlp.metric_batches for rm in r.resource_metrics]
    assert {sm.scope.name for rm in batches for sm in rm.scope_metrics} == {"phasechat"}
    assert {attributes(rm.resource.attributes)["service.name"] for rm in batches} == {"phasechat"}
    tokens = {
        attributes(p.attributes)["gen_ai.token.type"]: (p.sum, attributes(p.attributes))
        for p in metrics["gen_ai.client.token.usage"].histogram.data_points
    }
    assert tokens == {
        "input": (12, {**request, "gen_ai.token.type": "input"}),
        "output": (7, {**request, "gen_ai.token.type": "output"}),
    }


class Silent(ScriptedBackend):
    """Stops without a word: no first chunk."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield Finished("stop")


async def test_an_answer_without_a_word_has_a_duration_and_no_first_chunk(
    otlp: Receiver,
) -> None:
    ws = Workspace(Config(), BackendSpec(), settings=Settings(), backend=Silent())
    await one_turn(ws, "say nothing")
    assert ws.tracing is not None
    ws.tracing.flush()
    assert ws.tracing.problem is None
    await ws.aclose()
    metrics = otlp.metrics()
    assert metrics["gen_ai.client.operation.duration"].histogram.data_points[0].count == 1
    assert "gen_ai.client.operation.time_to_first_chunk" not in metrics
    assert "gen_ai.client.operation.time_per_output_chunk" not in metrics


@pytest.mark.parametrize("prefill_ms", [40.0, 900.0])
def test_a_server_s_wait_on_the_prefill_span_with_its_meaning_and_a_contradiction(
    otlp: Receiver, prefill_ms: float
) -> None:
    """A server part it defines otherwise (Dynamo's frontend) is keyed by its own name
    with its definition beside it; a part longer than the whole wait (900 ms in 90) is
    a contradiction, said on the span, and the parts' figures unknown."""
    exporter = TurnExporter()
    sent = time.perf_counter_ns()
    t = Trace("remote", "m", t_sent=sent)
    t.t_first_token = t.t_last_token = sent + 100_000_000
    t.t_done = sent + 110_000_000
    exporter.request_sent(t, GenerationRequest(messages=(Message("user", "hi"),)), Counted())
    computed = compute(t)
    m = replace(
        computed,
        timing=replace(computed.timing, connect_ms=10.0, sent_ms=12.0, headers_ms=50.0),
        server=replace(
            computed.server,
            server_source="Dynamo",
            server_queue_ms=5.0,
            server_queue_name="frontend: tokenize + route",
            server_queue_means="the frontend's tokenizing and routing",
            server_prompt_ms=prefill_ms,
        ),
    )
    exporter.request_ended(t, m)
    assert exporter.close(wait_s=30)
    (prefill,) = [s for s in otlp.spans() if s.name == "prefill"]
    wait = attributes(prefill.attributes)
    means = "the frontend's tokenizing and routing"
    assert wait["phasechat.wait.frontend_tokenize_route.means"] == means
    if prefill_ms > 90:
        assert wait["phasechat.wait.contradiction"] == (
            "contradiction: Dynamo says prefill 900 ms, longer than the 90 ms from the "
            "request's send to its first token measured here: its figures are unknown"
        )
        assert "phasechat.wait.prefill_ms" not in wait
    else:
        assert "phasechat.wait.contradiction" not in wait
        assert wait["phasechat.wait.frontend_tokenize_route_ms"] == 5.0
        assert wait["phasechat.wait.prefill_ms"] == 40.0


def test_closing_ends_a_request_still_open_as_cancelled(otlp: Receiver) -> None:
    exporter = TurnExporter()
    t = Trace("scripted", "m", t_sent=time.perf_counter_ns())
    exporter.request_sent(t, GenerationRequest(messages=(Message("user", "hi"),)), Silent())
    assert exporter.close(wait_s=30)
    assert exporter.dropped is None and exporter.problem is None
    assert t.finish == "cancelled"
    (root,) = [s for s in otlp.spans() if not s.parent_span_id]
    assert (root.status.code, root.status.message) == (2, "cancelled")  # ERROR


def test_closing_before_a_dead_collector_took_it_says_what_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing listens on the discard port: the SDK retries each batch, with backoff.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    exporter = TurnExporter()
    t = Trace("scripted", "m", t_sent=time.perf_counter_ns())
    exporter.request_sent(t, GenerationRequest(messages=(Message("user", "hi"),)), Silent())
    t.t_done = time.perf_counter_ns()
    exporter.request_ended(t, compute(t))
    assert exporter.close(wait_s=0.2) is False
    assert (
        exporter.dropped
        == exporter.problem
        == (
            "the OpenTelemetry collector at http://127.0.0.1:9 did not take the last spans "
            "and metric points within 0.2 s: they are dropped"
        )
    )


def test_a_figure_that_is_no_duration_is_no_metric_point(otlp: Receiver) -> None:
    """A negative or not-a-number time (a clock that stepped back, a hostile figure)
    is left out of the histograms rather than drawn."""
    exporter = TurnExporter()
    t = Trace("scripted", "m", t_sent=time.perf_counter_ns())
    exporter.request_sent(t, GenerationRequest(messages=(Message("user", "hi"),)), Silent())
    t.t_done = time.perf_counter_ns()
    computed = compute(t)
    timing = replace(computed.timing, ttft_ms=-5.0, e2e_ms=float("nan"))
    exporter.request_ended(t, replace(computed, timing=timing))
    assert exporter.close(wait_s=30)
    assert exporter.problem is None and exporter.notes == []  # the SDK was not given one
    metrics = otlp.metrics()
    assert "gen_ai.client.operation.duration" not in metrics
    assert "gen_ai.client.operation.time_to_first_chunk" not in metrics
