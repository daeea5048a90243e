"""Nothing of the OpenTelemetry SDK's own text reaches the terminal (issue 47, item 8).

The SDK logs a malformed `OTEL_EXPORTER_OTLP_HEADERS` entry whole, a collector's token
in it, and an unknown sampler by name; Python's last-resort handler printed both on
stderr (after the app's exit: in the terminal's scrollback). A collector that never
answers held the exit 5 s and its spans were dropped unsaid. Each case runs `phasechat
ask` in a real subprocess, against the scripted server and the OTLP receiver
(tests/otlp_receiver.py), and reads its stderr.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from phasechat.telemetry.otel import CLOSE_WAIT_S, sdk_line
from tests.fault_server import fault_server_thread
from tests.otlp_receiver import Receiver

TOKENS = ("tok-bearer-5f1e9a", "tok-colon-77c2d0", "tok-semi-3b9e41")
#: three malformed entries, as a user might write them, and one good one
HEADERS = f"authorization Bearer {TOKENS[0]},api-key:{TOKENS[1]},x-api-key={TOKENS[2]};other"
HEADERS += ",x-tenant=acme"


def ask(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`phasechat ask` on the scripted server, with only the OTEL_* variables given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(env_extra, NO_PROXY="127.0.0.1")
    with fault_server_thread() as server:
        args = ["--backend", "openai", "--base-url", server.base_url, "--model", "ok-3"]
        return subprocess.run(
            [sys.executable, "-m", "phasechat", *args, "ask", "--no-save", "hi"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


def test_a_malformed_header_and_sampler_are_said_in_our_words_without_the_token(
    otlp: Receiver,
) -> None:
    r = ask(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_EXPORTER_OTLP_HEADERS": HEADERS,
            "OTEL_TRACES_SAMPLER": "bogus-sampler",
        }
    )
    assert r.returncode == 0, r.stderr
    for token in TOKENS:
        assert token not in r.stderr and token not in r.stdout
    assert "bogus-sampler" not in r.stderr and "Header format invalid" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert all(line.startswith("phasechat: warning: ") for line in lines), lines
    (header,) = [line for line in lines if "OTEL_EXPORTER_OTLP_HEADERS" in line]
    assert "is left out" in header  # once, though both exporters read the variable
    (sampler,) = [line for line in lines if "OTEL_TRACES_SAMPLER" in line]
    assert "parentbased_always_on" in sampler
    # the turn's span still went, with the one header that was well formed
    assert any(not s.parent_span_id for s in otlp.spans())
    sent = [h for h in otlp.headers if "x-tenant" in h]
    assert sent and all(h["x-tenant"] == "acme" for h in sent)
    assert not any(t in str(h) for h in otlp.headers for t in TOKENS)


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """A port that takes connections and never answers (listening, never accepting)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_collector_that_never_answers_is_said_once_and_does_not_hold_the_exit(
    silent_collector: str,
) -> None:
    r = ask({"OTEL_EXPORTER_OTLP_ENDPOINT": silent_collector})
    assert r.returncode == 0, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line == (
        f"phasechat: warning: the OpenTelemetry collector at {silent_collector} did not take "
        f"the last spans and metric points within {CLOSE_WAIT_S:g} s: they are dropped"
    )
    assert CLOSE_WAIT_S <= 1.0  # the exit waits a second at most, not the SDK's 10


def test_any_other_sdk_warning_is_said_without_its_words() -> None:
    record = logging.LogRecord(
        "opentelemetry.sdk._shared_internal", logging.ERROR, "x", 1, "boom %s", ("k=v",), None
    )
    line = sdk_line(record)
    assert "k=v" not in line and "boom" not in line
    assert "opentelemetry.sdk._shared_internal" in line


async def test_the_app_shows_the_sdks_warnings_as_toasts_in_our_words(
    otlp: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
    from phasechat.chat.config.settings import Settings
    from phasechat.tui.app import TRACING_CHECK_S, PhasechatApp
    from tests.helpers import wait_for

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", HEADERS)
    app = PhasechatApp(
        settings=Settings(), backend=RemoteBackend(RemoteConfig(base_url="http://127.0.0.1:9/v1"))
    )
    toasts: list[str] = []
    notify = app.notify

    def kept(message: str, **kwargs: object) -> None:
        toasts.append(message)
        notify(message, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(app, "notify", kept)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: any("OTEL_EXPORTER_OTLP_HEADERS" in t for t in toasts))
        await pilot.pause(2 * TRACING_CHECK_S)  # later checks do not say it again
    assert len([t for t in toasts if "OTEL_EXPORTER_OTLP_HEADERS" in t]) == 1
    assert not any(token in t for t in toasts for token in TOKENS)
