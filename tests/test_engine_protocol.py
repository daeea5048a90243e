"""The engine process's protocol without the model (backends/local/engine_process.py): its
words and arithmetic as pure functions (a crash told by its status and its last stderr
line, the watchdog's two limits, the reload after a crash waited for as a load); the
child's `serve` in this process over a real socket pair; and the parent driving the real
child (`python -m phasechat.backends.local.engine_process`, the real wire) whose engine is
scripted (tests/engine_child.py), so that each exchange takes a fraction of a second.
What only llama.cpp shows (the same answer as in this process, a real crash mid-decode)
stays in test_engine_process.py and test_engine_hang.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import pytest

import phasechat
from phasechat.backends.base import TokenCount
from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    ModelLoaded,
    ModelLoading,
    StreamError,
    TextDelta,
)
from phasechat.backends.local import engine_process
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.engine_process import (
    HANG_S,
    START_S,
    EngineGone,
    EngineProcess,
    EngineState,
    ended,
    overdue,
    send_again,
    silent_end,
    state_of,
    waits_for_load,
)
from phasechat.backends.local.gguf import Geometry
from phasechat.backends.local.models import ModelNotFound
from phasechat.backends.tokens import estimate_messages
from tests.engine_child import (
    BLOCK_S,
    CRASH_STATUS,
    LINGER_S,
    LOAD_FAILED,
    TEMPLATED,
    WARM_S,
    ScriptedEngine,
)

#: where the engine process's own code is (its tasks are told by their coroutine's file)
ENGINE_FILE = Path(engine_process.__file__).name

AGAIN = "send again to load the model again"
GEOMETRY = Geometry("llama", "x", 30, 9, 3, 64, 64, 8192, None, 0, 99)


class _AnyStamp(int):
    """Equal to any stamp (an int): for the events whose time is the child's own."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int)

    __hash__ = int.__hash__


ANY_NS = _AnyStamp()


def ask(text: str, max_tokens: int = 64) -> GenerationRequest:
    return GenerationRequest((Message("user", text),), max_tokens=max_tokens, temperature=0)


def closing(stream: AsyncIterator[Event]) -> contextlib.aclosing[AsyncGenerator[Event, None]]:
    """An answer's stream closed on leaving the block (Esc), not when the loop finds it
    dropped: `EngineProcess.stream` is an async generator."""
    return contextlib.aclosing(cast(AsyncGenerator[Event, None], stream))


async def answer(engine: EngineProcess, text: str) -> list[Event]:
    return [e async for e in engine.stream(ask(text))]


#: a test here takes 5 s at most at load 5; one that hangs (a slip in the engine's waits)
#: fails after this, not after the minutes a mutation run's own limit allows
HUNG_S = 15


@pytest.fixture(autouse=True)
def _not_hung() -> Iterator[None]:
    """SIGALRM after `HUNG_S` (then every 5 s, for the teardown): a hang is a failure."""

    def hung(*_: object) -> None:
        signal.alarm(5)
        raise TimeoutError(f"the test did not end within {HUNG_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HUNG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- pure pieces --------------------------------------------------------------------------
def test_the_watchdog_gives_a_live_child_hang_s_and_a_starting_one_start_s() -> None:
    assert HANG_S < START_S
    assert not overdue(HANG_S, alive=True)
    assert overdue(HANG_S + 0.01, alive=True)
    assert not overdue(HANG_S + 0.01, alive=False)  # still importing: not yet
    assert not overdue(START_S, alive=False)
    assert overdue(START_S + 0.01, alive=False)
    assert not overdue(0.0, alive=True)


@pytest.mark.parametrize(
    ("code", "last", "said"),
    [
        (3, "the last words", "the engine process ended (exit status 3: the last words)"),
        (0, "", "the engine process ended (exit status 0)"),
        (1, "", "the engine process ended (exit status 1)"),
        (-9, "", "the engine process ended (killed by SIGKILL)"),
        (-11, "segv", "the engine process ended (killed by SIGSEGV: segv)"),
        (-1, "", "the engine process ended (killed by SIGHUP)"),
        (-200, "", "the engine process ended (killed by signal 200)"),
        (None, "", "the engine process ended (no exit status)"),
        (None, "oom", "the engine process ended (no exit status: oom)"),
    ],
)
def test_a_crash_is_told_by_its_exit_and_the_last_line_it_wrote(
    code: int | None, last: str, said: str
) -> None:
    assert ended(code, last) == said


def test_a_killed_silent_child_is_named_with_its_seconds_and_what_to_do() -> None:
    assert silent_end(5.4) == "the engine did not answer for 5 s: ended"
    assert silent_end(61.6) == "the engine did not answer for 62 s: ended"
    assert send_again("why", hung=False) == f"why: {AGAIN}"
    assert send_again("why", hung=True) == f"why; {AGAIN}"


@pytest.mark.parametrize(
    ("state", "crashed", "started", "waits"),
    [
        ("idle", False, False, True),  # the first send: the first load
        ("loading", False, True, True),  # a load under way
        ("failed", True, True, True),  # the reload after a crash is a load too
        ("failed", False, True, False),  # a load that failed: not tried again
        ("idle", False, True, False),
        ("ready", False, True, False),
    ],
)
def test_a_send_waits_for_a_load_as_its_own_phase_only_when_one_runs(
    state: Any, crashed: bool, started: bool, waits: bool
) -> None:
    assert waits_for_load(state, crashed, started) is waits


def test_the_state_read_from_the_childs_engine_is_every_field_its_own() -> None:
    engine = ScriptedEngine(LocalConfig(model_path=Path("/m/x.gguf"), gpu_layers=7, threads=5))
    engine.state, engine.state_detail, engine.context_window = "ready", "detail", 321
    engine.model_bytes, engine.ready_ns, engine.flash_attn = 99, 12345, True
    engine.geometry = GEOMETRY
    assert state_of(engine) == EngineState(  # type: ignore[arg-type]
        "ready", "detail", "x.gguf", Path("/m/x.gguf"), 321, GEOMETRY, 7, 5, 99,
        "scripted: no flash measurement", 12345, True,
    )  # fmt: skip


# -- the child's side, in this process ----------------------------------------------------
#: the in-process child answers in milliseconds (its engine scripted): silent this long,
#: it never will
WORD_S = 3.0


class Child:
    """`serve` in a thread of this process, its engine scripted, and the parent's end of
    the socket for the test to speak on (skipping the heartbeats)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(engine_process, "LocalBackend", ScriptedEngine)
        #: what ended a thread of the child's with an error (none may: its reader, its
        #: heartbeat and its loop each end quietly, also once the parent is gone)
        self.died: list[BaseException | None] = []
        monkeypatch.setattr(threading, "excepthook", lambda args: self.died.append(args.exc_value))
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        self.beats = 0
        child = Connection(theirs.detach())
        #: the threads before the child's: what it starts is told apart from them
        self.before = set(threading.enumerate())
        # not a daemon, as the real child's main thread is not: the threads `serve` starts
        # inherit nothing from it
        self.thread = threading.Thread(target=lambda: asyncio.run(engine_process.serve(child)))
        self.thread.start()

    def send(self, *message: Any) -> None:
        self.conn.send(message)

    def recv(self) -> tuple[Any, ...]:
        while True:
            assert self.conn.poll(WORD_S), f"the child said nothing for {WORD_S} s"
            message: tuple[Any, ...] = self.conn.recv()
            if message != ("alive",):
                return message
            self.beats += 1


@pytest.fixture
def child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[Child]:
    caplog.set_level(logging.ERROR, "asyncio")
    served = Child(monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF 12345")
    served.send("load", LocalConfig(model_path=model, n_ctx=333, gpu_layers=4), "mine")
    yield served
    with contextlib.suppress(OSError):
        served.send("close")
    served.thread.join(WORD_S)
    served.conn.close()
    time.sleep(2 * engine_process.HEARTBEAT_S)  # a heartbeat sent to no one: quietly
    assert served.died == []
    # nor did its loop log an error (a callback that failed, a task's exception never
    # retrieved): in the real child that is a traceback on stderr, whose last line a
    # crash message would quote as the engine's last words
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_the_child_loads_then_says_ready_with_its_engines_state(child: Child) -> None:
    kind, said = child.recv()
    assert kind == "ready"
    assert isinstance(said, EngineState)
    assert (said.state, said.model, said.context_window, said.gpu_layers) == (
        "ready", "m.gguf", 333, 4,
    )  # fmt: skip
    assert said.model_bytes == len(b"GGUF 12345") and said.ready_ns is not None


def test_the_child_streams_batches_then_ends_with_its_state(child: Child) -> None:
    child.recv()
    child.send("stream", 7, ask("one two three"), None)
    batches = []
    while (message := child.recv())[0] == "events":
        assert message[1] == 7
        batches.append(message[2])
    assert [[type(e).__name__ for e in b] for b in batches] == [
        ["TextDelta", "TextDelta"], ["TextDelta"], ["Finished"],
    ]  # fmt: skip
    assert [e.text for b in batches for e in b if isinstance(e, TextDelta)] == [
        " one", " two", " three",
    ]  # fmt: skip
    assert message[:2] == ("end", 7) and isinstance(message[2], EngineState)
    assert message[2].state == "ready"


def test_the_child_answers_its_calls_and_refuses_any_other(child: Child) -> None:
    child.recv()
    msgs = (Message("user", "a bb ccc"),)
    child.send("call", 1, "count_tokens", (msgs,))
    assert child.recv() == ("result", 1, True, TokenCount(3, estimated=False))
    child.send("call", 2, "warm", (msgs,))  # on a task of its own
    assert child.recv() == ("result", 2, True, 3)
    child.send("call", 3, "prompt_ids", (msgs,))
    assert child.recv() == ("result", 3, True, [1, 2, 3])
    child.send("call", 4, "cached_prefix", (msgs,))
    assert child.recv() == ("result", 4, True, 3)
    child.send("call", 5, "aclose", ())  # the engine's, but not the parent's to call
    kind, cid, ok, value = child.recv()
    assert (kind, cid, ok) == ("result", 5, False)
    assert isinstance(value, ValueError) and str(value) == "not an engine call: aclose"
    child.send("call", 6, "count_tokens", ())  # a call that raises is answered too
    kind, cid, ok, value = child.recv()
    assert (kind, cid, ok) == ("result", 6, False) and isinstance(value, TypeError)


def test_an_answer_that_cannot_be_sent_is_dropped_and_the_child_goes_on(child: Child) -> None:
    """pickle refuses a ctypes pointer (ValueError): that result never leaves the child
    (the parent's wait for it ends, `CALL_TIMEOUT_S`), and the next one does."""
    child.recv()
    child.send("call", 1, "count_tokens", ((Message("user", "unpicklable"),),))
    child.send("call", 2, "count_tokens", ((Message("user", "a b"),),))
    assert child.recv() == ("result", 2, True, TokenCount(2, estimated=False))


def test_a_cancel_stops_the_childs_answer_and_a_close_ends_it(child: Child) -> None:
    child.recv()
    child.send("stream", 1, ask("slow", 10_000), 0.01)
    assert child.recv()[0] == "events"
    child.send("cancel", 99)  # no such answer: nothing happens
    child.send("cancel", 1)
    while (message := child.recv())[0] == "events":
        pass
    assert message[:2] == ("end", 1)
    child.send("stream", 2, ask("slow", 10_000), None)
    assert child.recv()[:2] == ("events", 2)
    child.send("close")  # ends the answer in flight, and the child
    child.thread.join(WORD_S)
    assert not child.thread.is_alive()


def test_a_defect_in_the_engine_fails_the_answer_and_the_child_goes_on(child: Child) -> None:
    child.recv()
    child.send("stream", 1, ask("raise"), None)
    assert child.recv() == ("events", 1, [TextDelta("half", 1, ANY_NS)])
    assert child.recv() == ("events", 1, [StreamError("model", "engine process: scripted defect")])
    assert child.recv()[:2] == ("end", 1)
    child.send("stream", 2, ask("still here"), None)
    assert child.recv()[:2] == ("events", 2)


def test_a_child_whose_parent_is_gone_ends(child: Child) -> None:
    child.recv()
    child.conn.close()  # the app exited without a word
    child.thread.join(WORD_S)
    assert not child.thread.is_alive()


def test_the_child_says_it_is_alive_while_its_loop_is_busy(child: Child) -> None:
    child.recv()
    time.sleep(0.1 + 3 * engine_process.HEARTBEAT_S)
    child.send("call", 1, "count_tokens", ((),))
    assert child.recv()[0] == "result"
    assert 2 <= child.beats <= 6


def test_the_childs_threads_are_named_daemons(child: Child) -> None:
    """Its heartbeat and its inbox are daemons: a child whose `serve` returned (closed, or
    its parent gone) exits, not held for ever by a heartbeat sent to no one; and named,
    for a stack dump of a stuck engine (py-spy, faulthandler)."""
    child.recv()
    started = {t.name: t.daemon for t in set(threading.enumerate()) - child.before}
    assert started.pop("engine-alive") is True
    assert started.pop("engine-inbox") is True
    assert list(started.values()) == [False]  # the test's own, running `serve`


def test_the_child_hands_its_engine_the_interval_it_was_given(child: Child) -> None:
    """`every_s`, how often a batch is handed over (the app's redraw rate), reaches the
    child's engine as sent."""
    child.recv()
    child.send("stream", 1, ask("every"), 0.125)
    assert child.recv() == ("events", 1, [TextDelta(" 0.125", 1, ANY_NS)])
    assert child.recv() == ("events", 1, [Finished("stop")])
    assert child.recv()[:2] == ("end", 1)


def test_warm_render_and_prompt_ids_wait_off_the_childs_loop(child: Child) -> None:
    """They wait for the llama thread (behind an answer, for as long as it takes), so the
    child reads on meanwhile: a count sent after them (the UI's, waited for at most
    `CALL_TIMEOUT_S`) is answered first, and so is a cancel."""
    child.recv()
    later = ((Message("user", "later"),),)
    child.send("call", 1, "warm", later)
    child.send("call", 2, "render", later)
    child.send("call", 3, "prompt_ids", later)
    child.send("call", 4, "count_tokens", ((Message("user", "a b"),),))
    assert child.recv() == ("result", 4, True, TokenCount(2, estimated=False))
    rest = sorted(child.recv() for _ in range(3))
    assert rest == [("result", 1, True, 1), ("result", 2, True, None), ("result", 3, True, [5])]


def test_a_close_that_finds_an_answer_not_begun_ends_the_child_quietly(child: Child) -> None:
    """An answer asked for and closed before its task first ran (both read while the
    loop was busy): the close ends the child as any other, without a traceback."""
    child.recv()
    child.send("call", 1, "count_tokens", ((Message("user", "hold"),),))  # holds the loop
    child.send("stream", 2, ask("never begun"), None)
    child.send("close")
    assert child.recv() == ("result", 1, True, TokenCount(1, estimated=False))
    child.thread.join(WORD_S)
    assert not child.thread.is_alive()
    assert child.died == []  # serve returned, not raised (a CancelledError from its close)


def _held_tasks() -> int:
    """How many of the engine process's tasks (answers, calls) ended and are held still."""
    gc.collect()
    held = 0
    for o in gc.get_objects():
        if isinstance(o, asyncio.Task) and o.done():
            code = getattr(o.get_coro(), "cr_code", None)
            held += code is not None and Path(code.co_filename).name == ENGINE_FILE
    return held


def test_an_answer_or_a_call_that_ended_leaves_nothing_held_in_the_child(child: Child) -> None:
    """An answer's task holds its request, the whole chat: one kept per answer would
    grow the child by a copy of the chat each turn."""
    child.recv()
    warm = ((Message("user", "a b"),),)
    child.send("call", 1, "warm", warm)
    assert child.recv() == ("result", 1, True, 2)
    child.send("call", 2, "count_tokens", ((),))  # a turn of the loop after the warm's end
    assert child.recv()[:3] == ("result", 2, True)
    before = _held_tasks()  # the last call's, named by serve until the next
    for rid in (3, 4, 5):
        child.send("stream", rid, ask("a b c"), None)
        while child.recv()[0] != "end":
            pass
    for cid in (6, 7):
        child.send("call", cid, "warm", warm)
        assert child.recv() == ("result", cid, True, 2)
    child.send("call", 8, "count_tokens", ((),))
    assert child.recv()[:3] == ("result", 8, True)
    assert _held_tasks() == before


# -- the parent, with the real child, its engine scripted ---------------------------------
#: where this test's `phasechat` and `tests` come from (the work tree, or mutmut's copy)
ROOTS = sorted({str(Path(phasechat.__file__).resolve().parents[1]), str(Path(__file__).parents[1])})
SCRIPTED = "import tests.engine_child as child\nchild.install()\n"
#: a child that never says it is alive (wedged while importing)
MUTE = "import time\ntime.sleep(120)\n"
#: longer than a child may be silent and still be asked (its heartbeats stopped)
SILENT_FOR = engine_process.SILENT_S + 2 * engine_process.HEARTBEAT_S
#: a scripted child loads faster than its first heartbeat: until one, it is a child
#: still starting (given `START_S`, never called silent), which a real load never is
ALIVE_AFTER = 3 * engine_process.HEARTBEAT_S


class Engines:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path, self.monkeypatch = tmp_path, monkeypatch
        self.made: list[EngineProcess] = []
        self.pids: list[int] = []
        self.site(SCRIPTED)

    def site(self, text: str) -> None:
        site = self.tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(text)
        path = [str(site), *ROOTS, os.environ.get("PYTHONPATH", "")]
        self.monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))

    def model(self, content: bytes = b"GGUF scripted") -> Path:
        path = self.tmp_path / "model.gguf"
        path.write_bytes(content)
        return path

    def __call__(self, content: bytes = b"GGUF scripted", **config: Any) -> EngineProcess:
        engine = EngineProcess(LocalConfig(model_path=self.model(content), **config))
        self.made.append(engine)
        return engine

    def pid(self, engine: EngineProcess) -> int:
        pid = engine.pid
        assert pid is not None
        self.pids.append(pid)
        return pid

    async def started(self) -> tuple[EngineProcess, int]:
        """An engine loaded (its child scripted), and its child's pid."""
        engine = self()
        await engine.start()
        return engine, self.pid(engine)

    async def silenced(self) -> tuple[EngineProcess, int]:
        """An engine loaded whose child was alive, then stopped (SIGSTOP) and silent
        longer than `SILENT_S`; its child's pid."""
        engine, pid = await self.started()
        await asyncio.sleep(ALIVE_AFTER)
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(SILENT_FOR)  # the silence is the event
        return engine, pid


@pytest.fixture
async def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Engines]:
    made = Engines(tmp_path, monkeypatch)
    try:
        yield made
    finally:
        for pid in made.pids:  # a stopped child let go, whatever the test did
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for engine in made.made:
            await engine.aclose()


async def test_before_its_load_the_engine_says_what_it_will_load(engines: Engines) -> None:
    engine = engines(n_ctx=777)
    assert (engine.state, engine.state_detail) == ("idle", "not loaded")
    assert engine.model == "model.gguf" and engine.model_path == engines.model()
    assert engine.context_window == 777 and engine.context_source == "llama.cpp n_ctx"
    assert (engine.gpu_layers, engine.threads, engine.model_bytes) == (0, 0, 0)
    assert engine.geometry is None and engine.flash_attn is None and engine.flash_note == ""
    assert engine.pid is None and engine.name == "local"
    assert engine.cached_prefix((Message("user", "a b"),)) is None
    msgs = (Message("user", "a b"),)
    assert engine.count_tokens(msgs) == TokenCount(estimate_messages(msgs), estimated=True)
    assert await engine.warm((Message("user", "a b"),)) == 0
    assert await engine.render((Message("user", "a b"),)) is None
    assert await engine.prompt_ids((Message("user", "a b"),)) is None
    assert EngineProcess(name="other").name == "other"


async def test_an_engine_given_no_model_names_the_default_or_none(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named from the start, as LocalBackend is: the bundled model where it is installed;
    where it is not, "(default model)" until the child says (its engine finds none, or
    one of its own)."""
    bundled = engines.model()
    monkeypatch.setattr(engine_process, "default_model_path", lambda: bundled)
    assert EngineProcess(LocalConfig()).model_path == bundled
    assert EngineProcess(LocalConfig(model_path=Path("/m/own.gguf"))).model == "own.gguf"

    def missing() -> Path:
        raise ModelNotFound("not installed")

    monkeypatch.setattr(engine_process, "default_model_path", missing)
    engine = EngineProcess(LocalConfig())
    engines.made.append(engine)
    assert (engine.model, engine.model_path) == ("(default model)", None)
    await engine.start()
    assert (engine.state, engine.state_detail) == ("ready", "scripted (none)")
    assert engine.model == "(none)"


async def test_a_loaded_engine_reports_what_its_child_said(
    engines: Engines, capfd: pytest.CaptureFixture[str]
) -> None:
    engine = engines(b"GGUF twelve!", n_ctx=1234, threads=3, flash_attn=True, own_process=True)
    await engine.start()
    pid = engines.pid(engine)
    # the child's own session (Ctrl+C in the terminal is the app's), its stdout and
    # stderr not the terminal's
    assert os.getsid(pid) == pid != os.getsid(0)
    out, err = capfd.readouterr()
    assert "scripted" not in out + err
    # nor does it hold the terminal: it reads nothing, writes to nothing, its stderr a pipe
    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)]
    assert fds[:2] == ["/dev/null", "/dev/null"] and fds[2].startswith("pipe:"), fds
    assert (engine.state, engine.state_detail) == ("ready", "scripted model.gguf")
    assert engine.context_window == 1234 and engine.threads == 3
    assert engine.model_bytes == len(b"GGUF twelve!") and engine.flash_attn is True
    assert engine.flash_note == "scripted: no flash measurement"
    assert engine.model == "model.gguf" and engine.model_path == engines.model(b"GGUF twelve!")
    await engine.start()  # again: the same child
    assert engine.pid == engines.pids[0]


@pytest.mark.parametrize(("layers", "shares"), [(None, True), (0, True), (5, True), (-1, False)])
async def test_it_shares_the_cpu_unless_every_layer_is_on_a_gpu(
    engines: Engines, layers: int | None, shares: bool
) -> None:
    """No offload and a partial one (5 layers) run on this machine's cores; -1, every
    layer on the GPU, does not (the UI then draws at its full rate)."""
    engine = engines(gpu_layers=layers)
    assert engine.shares_cpu  # before the load: as if on the CPU
    await engine.start()
    assert engine.gpu_layers == (layers or 0)
    assert engine.shares_cpu is shares


async def test_an_answer_comes_through_as_the_child_stamped_it(engines: Engines) -> None:
    engine = engines()
    await engine.start()
    sent = time.perf_counter_ns()
    events = await answer(engine, "red green blue")
    received = time.perf_counter_ns()
    assert [e.text for e in events if isinstance(e, TextDelta)] == [" red", " green", " blue"]
    assert isinstance(events[-1], Finished) and events[-1].reason == "stop"
    stamps = [e.t_ns for e in events if isinstance(e, TextDelta) and e.t_ns is not None]
    assert len(stamps) == 3 and sent < stamps[0] <= stamps[-1] < received
    msgs = (Message("user", "red green blue yellow"),)
    assert engine.count_tokens(msgs) == TokenCount(4, estimated=False)
    assert engine.cached_prefix(msgs) == 3  # the last answer's prompt
    assert await engine.warm(msgs) == 4
    assert await engine.prompt_ids(msgs) == [3, 5, 4, 6]
    assert await engine.render(msgs) is None
    assert await engine.render((Message("user", "templated"),)) == TEMPLATED


async def test_the_engine_hands_the_child_the_interval_it_was_asked_for(
    engines: Engines,
) -> None:
    engine, _ = await engines.started()
    events = [e async for e in engine.stream(ask("every"), every_s=0.125)]
    assert events == [TextDelta(" 0.125", 1, ANY_NS), Finished("stop")]


async def test_the_readers_thread_is_a_named_daemon(engines: Engines) -> None:
    """A daemon: an app that quits without closing the engine is not held by it; named,
    for a stack dump of the app."""
    before = set(threading.enumerate())
    await engines.started()
    started = {t.name: t.daemon for t in set(threading.enumerate()) - before}
    assert started.get("engine-reader") is True, started


async def test_a_send_while_the_load_runs_waits_for_it_as_its_own_phase(
    engines: Engines,
) -> None:
    engine = engines()
    starting = asyncio.ensure_future(engine.start())
    async with asyncio.timeout(10):  # a generous limit: nothing is timed
        while engine.state != "loading":  # noqa: ASYNC110 - set by the task started above
            await asyncio.sleep(0)
    events = await answer(engine, "hello")
    assert isinstance(events[0], ModelLoading) and isinstance(events[1], ModelLoaded)
    assert events[2:] == [TextDelta(" hello", 1, ANY_NS), Finished("stop")]
    await starting


async def test_a_model_file_that_changes_under_a_loaded_engine_is_not_loaded_again(
    engines: Engines,
) -> None:
    """Only a load that failed is tried again when its file changes; a loaded engine
    keeps its model (and its KV cache) until it is closed."""
    engine, pid = await engines.started()
    engines.model(b"GGUF a newer download")
    events = await answer(engine, "same child")
    assert events[0] == TextDelta(" same", 1, ANY_NS)
    assert engine.pid == pid


async def test_a_call_in_flight_when_the_child_ends_is_estimated(engines: Engines) -> None:
    engine, _ = await engines.started()
    count = engine.count_tokens((Message("user", "die"),))
    assert count.estimated
    async with asyncio.timeout(10):  # a generous limit: nothing is timed
        while engine.state == "ready":  # noqa: ASYNC110 - set when the reader's word arrives
            await asyncio.sleep(0.01)
    why = f"the engine process ended (exit status {CRASH_STATUS})"
    assert (engine.state, engine.state_detail) == ("failed", f"{why}: {AGAIN}")


def test_a_send_to_a_child_whose_socket_is_shut_ends_the_answer_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that shut its end of the socket and lives on, its end not yet heard by a
    loop (the reader's word went to a closed one): the answer sent to it ends at once,
    saying the engine is not running and why, not waiting for a reply that cannot come."""
    engines = Engines(tmp_path, monkeypatch)
    engine = engines()
    try:
        asyncio.run(engine.start())
        engines.pid(engine)
        assert engine.count_tokens((Message("user", "linger"),)).estimated  # its end read
        assert engine.state == "ready" and engine.pid is not None  # no loop heard it
        events = asyncio.run(answer(engine, "hello"))
        why = "the engine process is not running: [Errno 32] Broken pipe"
        assert events == [StreamError("model", why)]
    finally:
        for pid in engines.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        asyncio.run(engine.aclose())


def test_an_engine_driven_from_a_new_loop_each_time_answers_and_finds_its_childs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller may run each request in a loop of its own (`asyncio.run`, as a command
    does): the answer comes through on the loop that asked for it, and a child that
    ended while no loop listened is found by the next send, which loads again."""
    engines = Engines(tmp_path, monkeypatch)
    engine = engines()
    died: list[BaseException | None] = []  # the reader thread ends quietly, word unheard
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    try:
        asyncio.run(engine.start())
        pid = engines.pid(engine)
        assert asyncio.run(answer(engine, "own loop")) == [
            TextDelta(" own", 1, ANY_NS), TextDelta(" loop", 1, ANY_NS), Finished("stop"),
        ]  # fmt: skip
        os.kill(pid, signal.SIGKILL)
        while engine.pid is not None:  # reaped (the test's alarm bounds the wait)
            time.sleep(0.01)
        assert engine.state == "ready"  # the reader's word went to a closed loop
        events = asyncio.run(answer(engine, "again"))
        assert isinstance(events[0], ModelLoading) and isinstance(events[1], ModelLoaded)
        assert events[2:] == [TextDelta(" again", 1, ANY_NS), Finished("stop")]
        assert engines.pid(engine) != pid
        asyncio.run(engine.aclose())  # the child's end is told to a closed loop ...
        assert engine._conn is None  # ... so the close itself lets go of the socket
        assert died == []
    finally:
        for pid in engines.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        asyncio.run(engine.aclose())


async def test_answers_that_ended_leave_nothing_held_in_the_parent(engines: Engines) -> None:
    """Each answer's queue goes with it, ended or cancelled (a crash would otherwise
    post its end to every answer the engine ever gave)."""
    engine, _ = await engines.started()
    await answer(engine, "first")

    def queues() -> int:
        gc.collect()
        return sum(isinstance(o, asyncio.Queue) for o in gc.get_objects())

    before = queues()
    for text in ("a b", "c d e"):
        await answer(engine, text)
    async with closing(engine.stream(ask("slow", 10_000))) as cancelled:
        async for _ in cancelled:
            break
    assert queues() == before


async def test_the_load_says_what_it_waits_for(engines: Engines) -> None:
    engine = engines()
    seen = [(engine.state, engine.state_detail)]
    starting = asyncio.ensure_future(engine.start())
    # each word as it changes, in order (how soon the child gets to its load varies
    # with the machine: a count of the loop's turns is no clock)
    async with asyncio.timeout(10):  # a generous limit: nothing is timed
        while not starting.done():
            await asyncio.sleep(0)
            if (now := (engine.state, engine.state_detail)) != seen[-1]:
                seen.append(now)
    start, load = ("loading", "starting the engine process"), ("loading", "loading model")
    assert seen[0][0] == "idle" and start in seen and load in seen, seen
    assert seen.index(start) < seen.index(load), seen
    await starting
    state: str = engine.state  # read again (mypy keeps the "loading" asserted above)
    assert state == "ready"


async def test_an_engine_process_that_cannot_start_says_why(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engines()
    monkeypatch.setattr(sys, "executable", "/no/such/python")
    await engine.start()
    assert engine.state == "failed" and engine.pid is None
    assert engine.state_detail == (
        "the engine process did not start: [Errno 2] No such file or directory: '/no/such/python'"
    )


async def test_an_answer_sent_before_the_load_waits_for_it_as_its_own_phase(
    engines: Engines,
) -> None:
    engine = engines()
    sent = time.perf_counter_ns()
    events = await answer(engine, "hello")
    assert isinstance(events[0], ModelLoading)
    assert isinstance(events[1], ModelLoaded) and events[1].t_ns is not None
    assert sent < events[1].t_ns
    assert isinstance(events[2], TextDelta) and isinstance(events[-1], Finished)
    events = await answer(engine, "hello")  # loaded: no wait
    assert isinstance(events[0], TextDelta)


async def test_a_crash_is_told_by_its_status_and_last_words_and_the_reload_is_a_load(
    engines: Engines,
) -> None:
    engine, first = await engines.started()
    events = await answer(engine, "crash")
    why = f"the engine process ended (exit status {CRASH_STATUS}: the last words)"
    assert events == [StreamError("model", why)]
    assert (engine.state, engine.state_detail) == ("failed", f"{why}: {AGAIN}")
    assert engine.cached_prefix((Message("user", "a"),)) is None  # a dead engine: not asked
    assert engine.count_tokens((Message("user", "a b"),)).estimated
    # the next send loads the model again in a new child, as its own phase
    sent = time.perf_counter_ns()
    events = await answer(engine, "after")
    assert isinstance(events[0], ModelLoading)
    assert isinstance(events[1], ModelLoaded) and events[1].t_ns is not None
    assert sent < events[1].t_ns
    assert events[2:] == [TextDelta(" after", 1, events[2].t_ns), Finished("stop")]  # type: ignore[union-attr]
    assert engine.state == "ready" and engines.pid(engine) != first


async def test_a_child_that_shuts_its_socket_but_lives_on_is_told_without_its_status(
    engines: Engines,
) -> None:
    """Its exit status is waited for 2 s, not until it ends (`LINGER_S` later, status 0)."""
    assert 2 < LINGER_S < 3
    engine, _ = await engines.started()
    events = await answer(engine, "linger")
    assert events == [StreamError("model", "the engine process ended (no exit status)")]
    assert engine.state_detail == f"the engine process ended (no exit status): {AGAIN}"


async def test_a_child_killed_between_answers_is_found_at_the_next_send(
    engines: Engines,
) -> None:
    engine, pid = await engines.started()
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(60):  # a generous limit: nothing is timed
        while engine.state == "ready":  # noqa: ASYNC110 - set when the reader's word arrives
            await asyncio.sleep(0.01)
    assert engine.state_detail == f"the engine process ended (killed by SIGKILL): {AGAIN}"
    events = await answer(engine, "again")
    assert isinstance(events[0], ModelLoading) and isinstance(events[-1], Finished)


async def test_a_failed_load_says_why_and_is_tried_again_once_the_file_changes(
    engines: Engines,
) -> None:
    engine = engines(b"FAIL")
    await engine.start()
    assert (engine.state, engine.state_detail) == ("failed", LOAD_FAILED)
    # not a crash: the send is refused at once, no load waited for
    events = await answer(engine, "hi")
    assert events == [StreamError("model", f"local model not ready: {LOAD_FAILED}")]
    engines.model(b"GGUF finished downloading")
    events = await answer(engine, "hi")
    assert isinstance(events[0], ModelLoading) and isinstance(events[1], ModelLoaded)
    assert isinstance(events[-1], Finished) and engine.state == "ready"


async def test_a_cancelled_answer_frees_the_engine_for_the_next(engines: Engines) -> None:
    """The child is told, and stops: the next answer comes from it at once (not from a
    new child after the drain's `DRAIN_TIMEOUT_S` and a load)."""
    engine, pid = await engines.started()
    got = 0
    async for event in engine.stream(ask("slow", 10_000)):
        got += isinstance(event, TextDelta)
        if got == 3:
            break
    began = time.monotonic()
    events = await answer(engine, "next one")
    # the send looked for the child's end every 20 ms, not once a second
    assert time.monotonic() - began < 0.9
    assert events == [TextDelta(" next", 1, ANY_NS), TextDelta(" one", 1, ANY_NS), Finished("stop")]
    assert engine.state == "ready" and engine.pid == pid


async def test_a_cancelled_answer_the_child_never_ends_is_waited_for_then_replaced(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child alive (its heartbeat goes on, its words too) that does not end a cancelled
    answer: the next send waits `DRAIN_TIMEOUT_S` for it, then kills the child, names it,
    and loads a new one for its own answer."""
    monkeypatch.setattr(engine_process, "DRAIN_TIMEOUT_S", 0.5)
    engine, pid = await engines.started()
    async with closing(engine.stream(ask("deaf", 10_000))) as deaf:
        async for _ in deaf:
            break
    events, said = [], ""
    async for event in engine.stream(ask("next")):
        said = said or engine.state_detail  # as the send found it, named
        events.append(event)
    assert isinstance(events[0], ModelLoading) and isinstance(events[1], ModelLoaded)
    assert events[2:] == [TextDelta(" next", 1, ANY_NS), Finished("stop")]
    # since the cancel: its wait (CANCEL_WAIT_S) and the drain's
    assert re.fullmatch(rf"the engine did not answer for [1-4] s: ended; {AGAIN}", said), said
    assert engines.pid(engine) != pid


async def test_a_child_the_kill_does_not_end_at_once_is_left_behind(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL takes effect only when a driver call returns (a process in state D): the
    send that killed the child waits `CLOSE_TIMEOUT_S` for its end, no longer, and goes
    on with a new one."""
    monkeypatch.setattr(engine_process, "DRAIN_TIMEOUT_S", 0.5)
    engine, pid = await engines.started()
    async with closing(engine.stream(ask("deaf", 10_000))) as deaf:
        async for _ in deaf:
            break
    monkeypatch.setattr(subprocess.Popen, "kill", lambda self: None)  # not taken yet
    events = await answer(engine, "next")
    assert isinstance(events[0], ModelLoading) and isinstance(events[1], ModelLoaded)
    assert events[2:] == [TextDelta(" next", 1, ANY_NS), Finished("stop")]
    assert engines.pid(engine) != pid
    os.kill(pid, 0)  # the old child lives on (the fixture ends it)


async def test_an_answer_closed_after_its_child_ended_ends_quietly(engines: Engines) -> None:
    """Esc after the crash, its word not yet read: the answer ends without an error of
    its own (the cancel has no child to go to); the crash is named as any other."""
    engine, _ = await engines.started()
    async with closing(engine.stream(ask("die"))) as dying:
        async for event in dying:
            assert event == TextDelta(" half", 1, ANY_NS)
            async with asyncio.timeout(10):  # a generous limit: nothing is timed
                while engine.state == "ready":  # noqa: ASYNC110 - set when the reader's word arrives
                    await asyncio.sleep(0.01)
            break
    why = f"the engine process ended (exit status {CRASH_STATUS})"
    assert (engine.state, engine.state_detail) == ("failed", f"{why}: {AGAIN}")


async def test_a_child_that_stops_answering_is_killed_and_named(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_process, "HANG_S", 0.5)
    engine, pid = await engines.started()
    await asyncio.sleep(ALIVE_AFTER)
    events = await answer(engine, "stop")
    assert isinstance(events[0], TextDelta)
    last = events[-1]
    assert isinstance(last, StreamError)
    assert re.fullmatch(r"the engine did not answer for [01] s: ended", last.message)
    assert engine.state == "failed"
    assert engine.state_detail == f"{last.message}; {AGAIN}"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    events = await answer(engine, "alive again")
    assert isinstance(events[0], ModelLoading) and isinstance(events[-1], Finished)


async def test_a_child_that_never_starts_is_given_start_s_then_named(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_process, "START_S", 0.5)
    engines.site(MUTE)
    engine = engines()
    began = time.monotonic()
    await engine.start()
    assert time.monotonic() - began < START_S
    assert engine.state == "failed"
    assert re.fullmatch(
        rf"the engine did not answer for [01] s: ended; {AGAIN}", engine.state_detail
    )


async def test_a_silent_child_is_not_waited_on_and_a_send_replaces_it(
    engines: Engines,
) -> None:
    engine, pid = await engines.silenced()
    began = time.monotonic()
    msgs = (Message("user", "a b c"),)
    assert engine.count_tokens(msgs) == TokenCount(estimate_messages(msgs), estimated=True)
    assert engine.cached_prefix(msgs) is None
    assert await engine.warm(msgs) == 0
    assert await engine.render(msgs) is None and await engine.prompt_ids(msgs) is None
    assert time.monotonic() - began < engine_process.CALL_TIMEOUT_S
    events, said = [], ""
    async for event in engine.stream(ask("new child")):
        said = said or engine.state_detail  # as the send found it, named
        events.append(event)
    assert isinstance(events[0], ModelLoading) and isinstance(events[-1], Finished)
    assert engines.pid(engine) != pid
    # named by its silence (1.5 s and the calls above), not the machine's uptime
    assert re.fullmatch(rf"the engine did not answer for [1-4] s: ended; {AGAIN}", said)


async def test_a_call_the_child_does_not_answer_is_estimated_after_call_timeout_s(
    engines: Engines,
) -> None:
    """A child alive (its heartbeat goes on) but busy: the UI's count waits at most
    `CALL_TIMEOUT_S`, then estimates."""
    engine, _ = await engines.started()
    began = time.monotonic()
    count = engine.count_tokens((Message("user", "block"),))
    waited = time.monotonic() - began
    assert count.estimated
    assert engine_process.CALL_TIMEOUT_S <= waited < BLOCK_S
    # its answer, when it comes, is for no one: dropped, and the engine goes on
    events = await answer(engine, "still here")
    assert events == [
        TextDelta(" still", 1, ANY_NS), TextDelta(" here", 1, ANY_NS), Finished("stop"),
    ]  # fmt: skip


async def test_a_call_off_the_ui_thread_waits_longer_than_a_count(engines: Engines) -> None:
    """A warm (or a render) waits behind the answer in flight up to `ASYNC_CALL_TIMEOUT_S`,
    not the UI's `CALL_TIMEOUT_S`: a warm that takes longer than a count may is answered."""
    assert engine_process.CALL_TIMEOUT_S < WARM_S < engine_process.ASYNC_CALL_TIMEOUT_S
    engine, _ = await engines.started()
    assert await engine.warm((Message("user", "slow warm"),)) == 2


async def test_an_engine_defect_fails_the_answer_not_the_engine(engines: Engines) -> None:
    engine, pid = await engines.started()
    events = await answer(engine, "raise")
    assert events[-1] == StreamError("model", "engine process: scripted defect")
    assert engine.state == "ready" and engine.pid == pid


def test_the_waits_are_those_the_docs_promise() -> None:
    """docs/faults.md and docs/backends.md tell the user how long each wait is: the
    heartbeat, a count asked of a silent child, any call, the kill of a silent one (and
    of one that never started), the drain of a cancelled answer; the constants are those
    numbers."""
    docs = Path(__file__).parents[1] / "docs"
    faults = " ".join((docs / "faults.md").read_text().split())
    backends = " ".join((docs / "backends.md").read_text().split())
    promised = re.search(
        r"a count asked of a child silent for (\d+) s is estimated without asking, any call "
        r"waits at most (\d+) s; .* left alone, the child is killed after (\d+) s",
        faults,
    )
    assert promised is not None
    silent, call, hang = (float(n) for n in promised.groups())
    told = re.search(
        r"It says it is alive (\w+) times a second .* ended is waited for by the next "
        r"send, at most (\d+) s\).* still starting, is given a minute",
        backends,
    )
    assert told is not None
    beats, drain = told.groups()
    assert (silent, call, hang) == (engine_process.SILENT_S, engine_process.CALL_TIMEOUT_S, HANG_S)
    assert beats == "four" and engine_process.HEARTBEAT_S == 1 / 4
    assert float(drain) == engine_process.DRAIN_TIMEOUT_S and START_S == 60  # a minute
    # Ctrl+Q quits within 2 s (CLOSE_TIMEOUT_S, and the cancelled answer's wait before it)
    assert engine_process.CLOSE_TIMEOUT_S + engine_process.CANCEL_WAIT_S <= 2.0


async def test_closing_ends_the_child(engines: Engines) -> None:
    """A healthy child is asked to close and ends by itself (its engine closed, status 0),
    not killed after `CLOSE_TIMEOUT_S`."""
    engine, pid = await engines.started()
    proc = engine._proc
    assert proc is not None
    await engine.aclose()
    assert proc.returncode == 0  # its own end: a kill is -9
    assert (engine.state, engine.state_detail, engine.pid) == ("idle", "closed", None)
    assert engine._conn is None and engine._errors is None  # nothing of it held
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: gone, not a zombie
    events = await answer(engine, "reopened")  # a closed engine loads again on a send
    assert isinstance(events[0], ModelLoading) and isinstance(events[-1], Finished)


async def test_closing_a_busy_child_kills_it_after_close_timeout_s(engines: Engines) -> None:
    """A child whose loop is held (a count of `block`, `BLOCK_S`) reads the close too late:
    it is killed after `CLOSE_TIMEOUT_S` (Ctrl+Q quits within 2 s), not waited for."""
    assert engine_process.CLOSE_TIMEOUT_S < BLOCK_S - 1
    engine, pid = await engines.started()
    await asyncio.sleep(ALIVE_AFTER)  # alive: asked to close, not killed at once
    loop = asyncio.get_running_loop()
    counting = loop.run_in_executor(None, engine.count_tokens, (Message("user", "block"),))
    await asyncio.sleep(0.2)  # the count read by the child, its loop held
    began = time.monotonic()
    await engine.aclose()
    assert time.monotonic() - began < BLOCK_S - 1
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert (await counting).estimated


async def test_closing_a_silent_child_kills_it_without_waiting(engines: Engines) -> None:
    engine, pid = await engines.silenced()
    began = time.monotonic()
    await engine.aclose()
    assert time.monotonic() - began < engine_process.CLOSE_TIMEOUT_S
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_call_says_what_went_unanswered_within_its_own_timeout_and_keeps_no_slot(
    engines: Engines,
) -> None:
    """A call the child does not answer in time (its loop held by `block`) ends soon after
    its own timeout, in words that name the call and the seconds, and leaves no slot
    for the answer that comes later."""
    engine, _ = await engines.started()
    began = time.monotonic()
    with pytest.raises(EngineGone) as gone:
        await asyncio.to_thread(
            engine._call, "count_tokens", (Message("user", "block"),), timeout=0.3
        )
    assert time.monotonic() - began < 0.9  # polled every 0.05 s, not once a second
    assert str(gone.value) == "the engine did not answer count_tokens in 0 s"
    assert engine._slots == {}


async def test_a_call_to_a_silent_child_is_not_sent_and_says_for_how_long(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = await engines.started()
    silent_s = engine_process.SILENT_S + 7.4
    monkeypatch.setattr(engine, "_silent", lambda: silent_s)
    with pytest.raises(EngineGone) as gone:
        engine._call("count_tokens", (Message("user", "one two"),))
    assert str(gone.value) == f"the engine has not answered for {silent_s:.0f} s"
    assert engine._slots == {}  # nothing was sent to wait for


async def test_calls_in_flight_together_each_get_their_own_answer(engines: Engines) -> None:
    """A second call sent while the child's loop is held by the first: each caller gets the
    answer to its own call, not the other's."""
    engine, _ = await engines.started()
    limit = BLOCK_S + 2

    def count(text: str) -> int:
        counted: TokenCount = engine._call("count_tokens", (Message("user", text),), timeout=limit)
        return counted.tokens

    first = asyncio.create_task(asyncio.to_thread(count, "block"))
    await asyncio.sleep(0.3)  # the child holds its loop on the first
    second = await asyncio.to_thread(count, "one two three")
    assert (await first, second) == (1, 3)


async def test_the_child_reads_no_terminal_and_writes_only_to_its_stderr_pipe(
    engines: Engines,
) -> None:
    """The UI owns the terminal: the child's stdin and stdout are /dev/null (a key is
    never read by it, a print never lands on the screen), its stderr a pipe (its tail
    names a crash). The test's own stdin is a pipe meanwhile, as a terminal would be: a
    child that inherited it would show it."""
    ours, theirs = os.pipe()
    stdin = os.dup(0)
    os.dup2(ours, 0)
    try:
        _, pid = await engines.started()
    finally:
        os.dup2(stdin, 0)
        for fd in (stdin, ours, theirs):
            os.close(fd)
    fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)}
    assert fds[0] == fds[1] == os.devnull
    assert fds[2].startswith("pipe:")


def test_a_send_with_no_child_says_the_engine_process_is_not_running() -> None:
    engine = EngineProcess(LocalConfig(model_path=Path("never-started.gguf")))
    with pytest.raises(EngineGone) as gone:
        engine._send(("stream", 1, None, None))
    assert str(gone.value) == "the engine process is not running"
