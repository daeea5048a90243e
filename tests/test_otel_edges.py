"""OpenTelemetry's view of a request at its edges (telemetry/otel.py; issue 49, item 3):
phases at each bound and one past it, the SDK's warnings in our words, the collector as
it may be shown, and a turn's attributes that the other tests' turns leave unset (stop
sequences, a length finish, a thinking answer, the service's own name), received by the
OTLP receiver."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    ReasoningDelta,
    TextDelta,
)
from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.workspace import Workspace
from phasechat.telemetry.otel import collector, enabled, phases, sdk_line
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
