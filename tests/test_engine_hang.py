"""Issue 47, items 1, 2, 4, 5: the engine's process stopped (SIGSTOP: what a wedged
llama.cpp or GPU-driver call looks like from outside), idle or mid-answer; a load that
failed on a file still being written; a child's stderr. The real bundled model through
the real child process; no time limit is asserted but generous bounds that prove "not
hung" (each far below the 30 s a call used to wait)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest

from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    StreamError,
    TextDelta,
)
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.engine_process import CALL_TIMEOUT_S, HANG_S, EngineProcess
from phasechat.backends.local.stderr_tail import STDERR_TAIL, StderrTail

pytestmark = pytest.mark.model

MSGS = (Message("user", "Write a very long story about the sea."),)
#: far below what a call or a cancel used to wait (30 s each, several a send)
NOT_HUNG_S = 10.0


def request(n: int) -> GenerationRequest:
    return GenerationRequest(MSGS, max_tokens=n, temperature=0)


def config(path: Path) -> LocalConfig:
    return LocalConfig(model_path=path, n_ctx=512, flash_attn=True, warmup=False)


@pytest.fixture
async def engine(model_path: Path) -> AsyncIterator[EngineProcess]:
    """A started engine of its own (each test stops or ends its child); closed after,
    its first child let go (SIGCONT) whatever happened, so no test leaves one stopped."""
    backend = EngineProcess(config(model_path))
    await backend.start()
    pid = backend.pid
    assert pid is not None and backend.state == "ready"
    try:
        yield backend
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        await backend.aclose()


def stop(engine: EngineProcess) -> int:
    """Stop the engine's child (SIGSTOP); its pid."""
    pid = engine.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    return pid


async def until(condition: Callable[[], bool], limit_s: float = 60) -> None:
    """Wait until `condition` holds (a generous limit: nothing is timed)."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 - set by the engine's reader thread
            await asyncio.sleep(0.05)


async def answers_from_a_new_child(engine: EngineProcess, old: int) -> None:
    events = [e async for e in engine.stream(request(4))]
    assert isinstance(events[-1], Finished), events[-1]
    assert engine.pid not in (None, old)
    with pytest.raises(ProcessLookupError):
        os.kill(old, 0)  # the stopped one ended and reaped


async def test_an_engine_stopped_while_idle_is_never_waited_on_and_is_ended_and_named(
    engine: EngineProcess,
) -> None:
    assert not engine.count_tokens(MSGS).estimated
    pid = stop(engine)
    t0 = time.monotonic()
    count = engine.count_tokens(MSGS)  # what the UI asks on Enter
    waited = time.monotonic() - t0
    assert count.estimated  # not asked of a child that does not answer
    assert waited <= CALL_TIMEOUT_S + 1
    await asyncio.sleep(1.5)  # silent for longer than SILENT_S
    t0 = time.monotonic()
    assert engine.count_tokens(MSGS).estimated
    assert engine.cached_prefix(MSGS) is None
    assert time.monotonic() - t0 < 0.5  # not even a short wait: it is known silent
    # The watchdog ends it and names it, nobody asking.
    await until(lambda: engine.state == "failed")
    assert engine.state_detail.startswith(f"the engine did not answer for {HANG_S:.0f} s: ended")
    assert engine.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not a zombie
    await answers_from_a_new_child(engine, pid)
    assert not engine.count_tokens(MSGS).estimated


async def test_a_send_to_a_silent_engine_ends_it_and_answers_from_a_new_one(
    engine: EngineProcess,
) -> None:
    pid = stop(engine)
    await asyncio.sleep(1.5)  # silent, not yet past the watchdog's grace
    assert engine.state == "ready"
    await answers_from_a_new_child(engine, pid)


async def test_closing_a_stream_whose_engine_stopped_mid_answer_returns_at_once(
    engine: EngineProcess,
) -> None:
    stream = cast(AsyncGenerator[Event, None], engine.stream(request(400)))
    texts = 0
    async for event in stream:
        texts += isinstance(event, TextDelta)
        if texts == 2:
            break
    pid = stop(engine)
    t0 = time.monotonic()
    await stream.aclose()  # what Esc does to the turn's task
    assert time.monotonic() - t0 < NOT_HUNG_S
    # the child does not end the answer: the watchdog ends the child, named
    await until(lambda: engine.state == "failed")
    assert "the engine did not answer for" in engine.state_detail
    await answers_from_a_new_child(engine, pid)


async def test_an_answer_whose_engine_stops_ends_with_the_engine_named(
    engine: EngineProcess,
) -> None:
    seen: list[Event] = []
    async for event in engine.stream(request(400)):
        seen.append(event)
        if isinstance(event, TextDelta) and sum(isinstance(e, TextDelta) for e in seen) == 2:
            stop(engine)
    last = seen[-1]
    assert isinstance(last, StreamError)
    assert last.message.startswith("the engine did not answer for")
    assert last.message.endswith(": ended")
    assert engine.state == "failed"


async def test_closing_a_stopped_engine_does_not_wait_for_it(engine: EngineProcess) -> None:
    pid = stop(engine)
    await asyncio.sleep(1.5)
    t0 = time.monotonic()
    await engine.aclose()
    assert time.monotonic() - t0 < 2  # Ctrl+Q quits within 2 s whatever the child does
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_failed_load_is_tried_again_once_the_file_changes(
    tmp_path: Path, model_path: Path
) -> None:
    whole = await asyncio.to_thread(model_path.read_bytes)
    path = tmp_path / "downloading.gguf"
    path.write_bytes(whole[: len(whole) // 3])  # a download still running
    engine = EngineProcess(config(path))
    try:
        await engine.start()
        assert engine.state == "failed" and "truncated" in engine.state_detail
        first = engine.pid
        events = [e async for e in engine.stream(request(4))]
        assert isinstance(events[-1], StreamError) and "truncated" in events[-1].message
        assert engine.pid == first  # the same file: the same answer, not a reload
        path.write_bytes(whole)  # the download finished
        events = [e async for e in engine.stream(request(4))]
        assert isinstance(events[-1], Finished), events[-1]
        state: str = engine.state  # read again (mypy keeps the "failed" asserted above)
        assert state == "ready" and engine.pid not in (None, first)
    finally:
        await engine.aclose()


async def test_the_engine_stderr_is_a_pipe_not_a_file(engine: EngineProcess) -> None:
    assert os.readlink(f"/proc/{engine.pid}/fd/2").startswith("pipe:")


def test_a_child_writing_without_end_is_kept_to_its_tail() -> None:
    """50 MB on stderr: what is kept is the tail, and its last line names the crash."""
    code = (
        "import sys\n"
        "for _ in range(50_000): sys.stderr.write('x' * 999 + '\\n')\n"
        "sys.stderr.write('GGML_ASSERT(last words) failed\\n')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    tail = StderrTail(proc)
    assert proc.wait(timeout=120) == 0
    assert tail.last_line() == "GGML_ASSERT(last words) failed"
    assert 0 < tail.size <= STDERR_TAIL
