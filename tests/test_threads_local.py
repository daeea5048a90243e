"""Thread changes on the real bundled model: the greedy answer does not depend on them,
and they reach the telemetry."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp
import pytest

from phasechat.backends.events import EngineThreads, GenerationRequest, Message, TextDelta
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.threads import Change
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record

pytestmark = pytest.mark.model

REQUEST = GenerationRequest(
    (Message("user", "Write a long story about a dragon who learns to fly."),),
    max_tokens=48,
    temperature=0,
)


class Scripted:
    """A policy that changes the count at given token numbers (the decision is not under
    test here: applying it between two decodes is)."""

    def __init__(self, plan: dict[int, int], threads: int) -> None:
        self.plan, self.threads, self.seen = plan, threads, 0

    def begin(self, free_cores: float | None = None) -> Change | None:
        self.seen = 0
        return None

    def observe(self, gap_ns: int) -> Change | None:
        assert gap_ns > 0
        self.seen += 1
        n = self.plan.get(self.seen)
        if n is None:
            return None
        self.threads = n
        return Change(n, f"scripted at gap {self.seen}")


@pytest.fixture(scope="module")
def one_thread(model_path: object) -> Iterator[LocalBackend]:
    import asyncio

    backend = LocalBackend(LocalConfig(n_ctx=1024, threads=1))
    asyncio.run(backend.start())
    assert backend.state == "ready", backend.state_detail
    yield backend
    asyncio.run(backend.aclose())


async def answer(backend: LocalBackend) -> tuple[str, Trace, list[EngineThreads]]:
    trace = Trace(backend="local", model=backend.model)
    seen: list[EngineThreads] = []
    async for event in record(backend.stream(REQUEST), trace):
        if isinstance(event, EngineThreads):
            seen.append(event)
    return trace.text, trace, seen


async def test_a_mid_answer_thread_change_keeps_the_greedy_answer(
    one_thread: LocalBackend,
) -> None:
    threads = one_thread._threads
    assert threads is not None and threads.policy is None  # --threads 1: fixed
    fixed, trace, seen = await answer(one_thread)
    assert [(e.threads, e.at_token) for e in seen] == [(1, 0)]
    assert compute(trace).thread_changes == 0

    # 1 -> 2 -> 1 -> 2 threads (few tokens at 2, which a loaded test machine makes slow);
    # the context was created with 1, `max_threads` only labels the events
    threads.policy = Scripted({8: 2, 20: 1, 40: 2}, threads=1)  # type: ignore[assignment]
    threads.max_threads = 2
    try:
        changed, trace, seen = await answer(one_thread)
        ctx_threads = llama_cpp.llama_n_threads(one_thread._llm.ctx)
    finally:
        threads.policy, threads.max_threads = None, 1
        llama_cpp.llama_set_n_threads(one_thread._llm.ctx, 1, 1)
    assert trace.tokens == 48 and len(fixed) > 80
    assert changed == fixed
    assert [(e.threads, e.at_token) for e in seen] == [(1, 0), (2, 9), (1, 21), (2, 41)]
    assert ctx_threads == 2  # the context really ran on two threads at the end
    m = compute(trace)
    assert (m.threads, m.thread_changes) == (2, 3)
    assert m.threads_reason == "scripted at gap 40"
    assert "threads 2 of 2 · 3 changes · at token 41: scripted at gap 40" in trace_note(trace)


def trace_note(trace: Trace) -> str:
    from phasechat.telemetry.live import threads_note

    return threads_note(trace)


async def test_the_default_is_adaptive_and_says_so(local_backend: LocalBackend) -> None:
    """The session's backend has no --threads: its first event after the prompt says how
    many threads it starts with, and that they adapt (one core: fixed at one)."""
    events = [e async for e in local_backend.stream(REQUEST)]
    start = next(e for e in events if isinstance(e, EngineThreads))
    assert events.index(start) == 1  # right after PromptEvaluated
    assert start.max_threads == local_backend.threads >= start.threads >= 1
    threads = local_backend._threads
    assert threads is not None and threads.adaptive == (local_backend.threads > 1)
    assert sum(isinstance(e, TextDelta) for e in events) == 48


async def test_every_local_backend_decodes_on_one_thread(
    one_thread: LocalBackend, local_backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an OpenMP build a second thread that decodes brings a second worker team,
    and libgomp's barriers then sleep instead of spinning (decode about halved here):
    two backends' prefills and decodes must all run on the one llama thread."""
    import threading

    import llama_cpp.llama_cpp as lib

    callers: set[tuple[str, int]] = set()
    decode, evaluate = lib.llama_decode, llama_cpp.Llama.eval

    def traced_decode(*args: object) -> int:
        callers.add((threading.current_thread().name, threading.get_ident()))
        return int(decode(*args))

    def traced_eval(self: llama_cpp.Llama, tokens: object) -> None:
        callers.add((threading.current_thread().name, threading.get_ident()))
        evaluate(self, tokens)  # type: ignore[arg-type]

    monkeypatch.setattr(lib, "llama_decode", traced_decode)
    monkeypatch.setattr(llama_cpp.Llama, "eval", traced_eval)
    assert one_thread._executor is local_backend._executor
    for backend in (one_thread, local_backend, one_thread):
        text, trace, _ = await answer(backend)
        assert trace.tokens == 48 and text
    assert len(callers) == 1 and callers.pop()[0].startswith("llama")


async def test_an_answer_beside_a_busy_process_says_how_busy_it_kept_the_cpus(
    one_thread: LocalBackend,
) -> None:
    """One process spinning beside a one-thread decode (issue 48): the answer's last
    engine event before `Finished` is its `CpuBusy`, which counts the spinner (at least
    half a CPU: it shares the cores with the decode) and not the decode itself (this
    process's CPU time is left out), of the CPUs this process may run on."""
    import asyncio
    import os
    import sys

    from phasechat.backends.events import CpuBusy, Finished

    long = GenerationRequest(REQUEST.messages, max_tokens=200, temperature=0)
    spinner = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    try:
        trace = Trace(backend="local", model=one_thread.model)
        events = [e async for e in record(one_thread.stream(long), trace)]
    finally:
        spinner.kill()
        await spinner.wait()
    busy = [e for e in events if isinstance(e, CpuBusy)]
    assert len(busy) == 1 and isinstance(events[-1], Finished)
    last_text = max(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    assert events.index(busy[0]) > last_text
    cpus = len(os.sched_getaffinity(0))
    m = compute(trace)
    assert (m.busy_cpus, m.cpus) == (busy[0].others, cpus)
    assert 0.5 <= busy[0].others <= cpus
