"""The local engine in a process of its own (backends/engine_process.py), on the real
bundled model: the same answer as in the app's process, stamps taken in the engine's
process on the clock the app reads, cancel, a crash the app survives and a reload."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from phasechat.backends.events import (
    Finished,
    GenerationRequest,
    Message,
    ModelLoaded,
    ModelLoading,
    PromptEvaluated,
    StreamError,
    TextDelta,
)
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.engine_process import EngineProcess
from phasechat.chat.config.profiles import BackendSpec, make_backend
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from tests.helpers import wait_for

pytestmark = pytest.mark.model

MSGS = (Message("system", "You are a helpful assistant."), Message("user", "Name three colors."))


def greedy(n: int) -> GenerationRequest:
    return GenerationRequest(MSGS, max_tokens=n, temperature=0)


@pytest.fixture(scope="module")
def engine(model_path: Path) -> EngineProcess:
    """One engine process for the module's tests (each test leaves it running)."""
    backend = EngineProcess(same(model_path))
    asyncio.run(backend.start())
    return backend


def same(model_path: Path) -> LocalConfig:
    """One configuration for both sides of a comparison: a fixed thread count and flash
    attention set (each changes the sums, and so a greedy answer's later tokens)."""
    return LocalConfig(model_path=model_path, n_ctx=2048, threads=2, flash_attn=True)


@pytest.fixture(scope="module", autouse=True)
def _closed(engine: EngineProcess) -> object:
    yield None
    asyncio.run(engine.aclose())


def test_the_app_builds_it_for_a_local_profile_that_asks() -> None:
    spec = BackendSpec("local", local=LocalConfig(own_process=True))
    assert isinstance(make_backend(spec), EngineProcess)
    assert isinstance(make_backend(BackendSpec("local")), LocalBackend)


async def test_it_answers_as_the_engine_in_this_process_does(
    engine: EngineProcess, model_path: Path
) -> None:
    local_backend = LocalBackend(same(model_path))
    await local_backend.start()
    try:
        await answers_alike(engine, local_backend)
    finally:
        await local_backend.aclose()


async def answers_alike(engine: EngineProcess, local_backend: LocalBackend) -> None:
    """The same answer, counts and cache from the engine process and from this one."""
    assert engine.state == "ready", engine.state_detail
    assert engine.pid is not None and engine.pid != os.getpid()
    assert engine.geometry == local_backend.geometry
    assert engine.context_window == 2048
    assert engine.count_tokens(MSGS) == local_backend.count_tokens(MSGS)
    sent = time.perf_counter_ns()
    theirs = [e async for e in engine.stream(greedy(16))]
    received = time.perf_counter_ns()
    ours = [e async for e in local_backend.stream(greedy(16))]

    def text(events: Sequence[object]) -> str:
        return "".join(e.text for e in events if isinstance(e, TextDelta))

    assert text(theirs) == text(ours) and text(theirs).strip()
    assert isinstance(theirs[0], PromptEvaluated)
    assert theirs[0].prompt_tokens == ours[0].prompt_tokens  # type: ignore[union-attr]
    assert isinstance(theirs[-1], Finished)
    # Stamped in the engine's process, on the clock this process reads: inside the
    # window between the send and the last event's arrival, and in order.
    stamps = [e.t_ns for e in theirs if isinstance(e, TextDelta) and e.t_ns is not None]
    assert len(stamps) >= 2
    assert sent < stamps[0] and stamps[-1] < received
    assert stamps == sorted(stamps)
    # what the engine holds after the answer: the prompt, as in this process
    assert engine.cached_prefix(MSGS) == engine.count_tokens(MSGS).tokens


async def test_a_cancelled_answer_frees_the_engine_for_the_next(engine: EngineProcess) -> None:
    got = 0
    async for event in engine.stream(greedy(400)):
        if isinstance(event, TextDelta):
            got += 1
            if got == 3:
                break  # closing the iterator: the engine stops at the next token
    events = [e async for e in engine.stream(greedy(4))]
    assert isinstance(events[-1], Finished) and events[-1].reason in ("length", "stop")
    assert engine.state == "ready"


async def test_a_crashed_engine_ends_the_answer_and_loads_again_on_the_next(
    engine: EngineProcess,
) -> None:
    pid = engine.pid
    assert pid is not None
    seen: list[object] = []
    async for event in engine.stream(greedy(2000)):
        seen.append(event)
        # once: events that are not text (a stats event) can follow the second token
        # before the end arrives, and a second kill finds no process (a busy machine)
        if isinstance(event, TextDelta) and sum(isinstance(e, TextDelta) for e in seen) == 2:
            os.kill(pid, signal.SIGKILL)  # what a segfault in llama.cpp would do
    last = seen[-1]
    assert isinstance(last, StreamError)
    assert last.message == "the engine process ended (killed by SIGKILL)"
    assert engine.state == "failed"
    assert "send again to load the model again" in engine.state_detail
    assert engine.cached_prefix(MSGS) is None  # nothing is asked of a dead engine
    assert engine.count_tokens(MSGS).estimated
    # The next send loads the model again, in a new process, and answers; the load is
    # its own phase, as the first one was (not counted in the TTFT or the prefill)
    events = [e async for e in engine.stream(greedy(4))]
    assert isinstance(events[0], ModelLoading) and isinstance(events[1], ModelLoaded)
    assert isinstance(events[-1], Finished)
    state: str = engine.state  # read again (mypy keeps the "failed" asserted above)
    assert state == "ready"
    assert engine.pid not in (None, pid)


@pytest.mark.parametrize(("layers", "shares"), [(5, True), (-1, False), (0, True)])
async def test_it_shares_the_cpu_unless_every_layer_is_on_a_gpu(
    model_path: Path, layers: int, shares: bool
) -> None:
    """A partial offload (5 layers) still runs the rest on this machine's cores; -1 (all
    layers) does not. (On a CPU build llama.cpp ignores the number, but the engine
    reports the setting it was given, which is what the UI paces itself by.)"""
    backend = EngineProcess(LocalConfig(model_path=model_path, n_ctx=256, gpu_layers=layers))
    try:
        await backend.start()
        assert backend.state == "ready" and backend.gpu_layers == layers
        assert backend.shares_cpu is shares
    finally:
        await backend.aclose()


async def test_closing_ends_the_process(model_path: Path) -> None:
    backend = EngineProcess(LocalConfig(model_path=model_path, n_ctx=512, flash_attn=True))
    await backend.start()
    pid = backend.pid
    assert pid is not None
    await backend.aclose()
    assert backend.state == "idle" and backend.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: gone, not a zombie


async def test_a_model_that_fails_to_load_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    inline = LocalBackend(LocalConfig(model_path=bad))
    await inline.start()
    backend = EngineProcess(LocalConfig(model_path=bad))
    await backend.start()
    try:
        assert backend.state == inline.state == "failed"
        assert backend.state_detail == inline.state_detail  # the load's own words
        events = [e async for e in backend.stream(greedy(4))]
        assert isinstance(events[-1], StreamError)
        assert events[-1].message.startswith("local model not ready: ")
    finally:
        await backend.aclose()


async def test_the_app_survives_an_engine_crash_says_so_and_answers_again(
    model_path: Path,
) -> None:
    backend = EngineProcess(LocalConfig(model_path=model_path, n_ctx=1024, flash_attn=True))
    app = PhasechatApp(settings=Settings(max_tokens=400, temperature=0), backend=backend)
    try:
        async with app.run_test(size=(100, 40)) as pilot:
            await wait_for(pilot, lambda: backend.state == "ready")
            pid = backend.pid
            assert pid is not None
            app.chat.send("Write a very long story about the ocean.")
            await wait_for(
                pilot,
                lambda: bool(app.turns.exchanges) and app.turns.exchanges[0].trace.tokens >= 3,
            )
            os.kill(pid, signal.SIGKILL)
            await wait_for(pilot, lambda: not app.chat.generating)
            answer = app.turns.exchanges[0].answer
            assert answer.status == "error"
            assert answer.error == "the engine process ended (killed by SIGKILL)"
            assert answer.content  # the partial answer is kept
            status = str(app.query_one("#status").render())
            assert "the engine process ended" in status
            # Sending again loads the model in a new process and answers.
            app.turns.update_settings(max_tokens=8)
            app.chat.send("Hi")
            await wait_for(pilot, lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
            assert app.turns.exchanges[1].answer.status == "complete"
            assert backend.pid not in (None, pid)
    finally:
        await backend.aclose()


async def test_an_answer_sent_before_the_load_waits_for_it_as_its_own_phase(
    model_path: Path,
) -> None:
    backend = EngineProcess(LocalConfig(model_path=model_path, n_ctx=512, flash_attn=True))
    assert backend.model == model_path.name  # named before anything is loaded
    sent = time.perf_counter_ns()
    try:
        events = [e async for e in backend.stream(greedy(4))]
    finally:
        await backend.aclose()
    assert isinstance(events[0], ModelLoading)
    loaded = events[1]
    assert isinstance(loaded, ModelLoaded) and loaded.t_ns is not None
    first = next(e for e in events if isinstance(e, TextDelta) and e.t_ns is not None)
    assert first.t_ns is not None
    # the load ended in the engine's process, after the send and before the first token
    assert sent < loaded.t_ns < first.t_ns
    assert isinstance(events[-1], Finished)


async def test_it_gives_what_teacher_forcing_reads(
    engine: EngineProcess, local_backend: LocalBackend, model_path: Path
) -> None:
    """The divergence view reads A's prompt ids, KV type, flash attention and threads
    from the engine in its own process as from the one in the app's."""
    from phasechat.backends.local.teacher import EngineSetting
    from phasechat.chat.trips.forced_sides import Forced, forced_of

    ids = await engine.prompt_ids(MSGS)
    assert ids is not None and ids == local_backend.format_prompt(MSGS)[0]
    # same(): flash attention set on, 2 threads (the fixture's own load measures flash)
    assert forced_of(engine) == Forced(model_path, EngineSetting("f16", True, 2))
