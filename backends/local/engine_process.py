"""The local engine in a process of its own: a `LocalBackend` run by a child Python,
driven over a socket by `EngineProcess`, which the app uses in its place.

Why a process: with every layer on a GPU a decode step is about a millisecond, and most
of it is the Python around `llama_decode` (sampling, detokenizing, stamping). In the
app's process that Python needs the interpreter lock the UI holds while it draws: on an
H200 the TUI took a fifth of decode (issue 35), and on this CPU the same shows with
bench/fast_model.py (`bench.tui_share --model fast`). In a process of its own the engine
shares no lock with the UI; what is left between them is the cores, which
`shares_cpu` reports as before (an engine on the CPU, or one that is partly).

Timing is untouched: every event is stamped in the child (`time.perf_counter_ns()`,
CLOCK_MONOTONIC, one clock for every process on the machine), and handed over in the
batches the child's own hand-over makes. A crash of the engine (a segfault in
llama.cpp, the OOM killer) ends the answer with an error that says so; the app stays
up, and the next `start` or send loads the model again.

A child that stops answering (a wedged driver call; SIGSTOP does the same) never holds
the app: the child says it is alive every `HEARTBEAT_S` from a thread of its own, a
call the UI makes waits at most `CALL_TIMEOUT_S` and not at all once the child has been
silent for `SILENT_S` (the count is estimated instead), a cancelled answer is left to
end on its own, and a child silent for `HANG_S` is killed by the reader thread and named
("the engine did not answer for 5 s: ended"); the next send starts a new one. So does a
send after a load that failed, once the model file changed (a download that finished).
The child's stderr goes through a pipe into a bounded tail (its last lines explain a
crash), never the terminal and never a file that grows.

The wire: `multiprocessing.connection.Connection` over a socket pair (pickles, each
message whole). Parent -> child: ("load", config, name), ("stream", id, request,
every_s), ("cancel", id), ("call", id, method, args), ("close",). Child -> parent:
("ready", state), ("events", id, [event, ...]), ("end", id, state),
("result", id, ok, value), ("alive",). Only the parent's own messages are trusted: the child is
this program, run by this program.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Generic, TypeVar

from phasechat.backends.base import LoadState, RenderedPrompt, TokenCount
from phasechat.backends.events import (
    Event,
    GenerationRequest,
    Message,
    ModelLoaded,
    ModelLoading,
    StreamError,
)
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.capability import LocalEngine
from phasechat.backends.local.gguf import Geometry
from phasechat.backends.local.models import ModelNotFound, default_model_path
from phasechat.backends.local.stderr_tail import StderrTail

T = TypeVar("T")

#: how long a call the UI waits on (a token count) may take before it is estimated
CALL_TIMEOUT_S = 2.0
#: how long a call off the UI's thread (warm, render) may wait behind an answer
ASYNC_CALL_TIMEOUT_S = 30.0
#: how long a closing child gets before it is killed (Ctrl+Q quits within 2 s)
CLOSE_TIMEOUT_S = 1.5
#: how long a cancelled answer is waited for before the stream returns (Esc); the next
#: send waits for it up to `DRAIN_TIMEOUT_S`, then ends the child
CANCEL_WAIT_S = 0.5
DRAIN_TIMEOUT_S = 10.0
#: the child says it is alive this often
HEARTBEAT_S = 0.25
#: silent this long, the child is not asked (its counts are estimated)
SILENT_S = 1.0
#: silent this long, the child is killed and named
HANG_S = 5.0
#: a child that never said it is alive (still importing) is given this long
START_S = 60.0


@dataclass(frozen=True, slots=True)
class EngineState:
    """What the app reads of the engine between messages, as the child last said."""

    state: LoadState
    detail: str
    model: str
    model_path: Path | None
    context_window: int | None
    geometry: Geometry | None
    gpu_layers: int
    threads: int
    model_bytes: int
    flash_note: str
    #: when the load ended, stamped in the child (the clock every process reads)
    ready_ns: int | None = None
    #: flash attention as loaded (None: not loaded)
    flash_attn: bool | None = None


def state_of(backend: LocalBackend) -> EngineState:
    """The child's backend, as the parent shows it."""
    return EngineState(
        backend.state,
        backend.state_detail,
        backend.model,
        backend.model_path,
        backend.context_window,
        backend.geometry,
        backend.gpu_layers,
        backend.threads,
        backend.model_bytes,
        backend.flash_note,
        backend.ready_ns,
        backend.flash_attn,
    )


class EngineGone(RuntimeError):
    """The engine process ended before it answered."""


class _Slot:
    """One call's answer, set by the reader thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


class _Said(Generic[T]):
    """A property of the engine in the child, as its last `EngineState` said (`before` until
    one has): `EngineProcess` proxies `LocalEngine` through these, and mypy checks each
    against the protocol's type."""

    def __init__(self, read: Callable[[EngineState], T], before: T) -> None:
        self._read, self._before = read, before

    def __get__(self, engine: EngineProcess, owner: type[EngineProcess]) -> T:
        said = engine._said
        return self._before if said is None else self._read(said)


class EngineProcess(LocalEngine):
    """A `LocalEngine`: the local model in a child process (see the module's docstring)."""

    exact_token_counts = True
    serial = True  # one llama.cpp context: requests run one after the other

    def __init__(self, config: LocalConfig | None = None, name: str = "local") -> None:
        self.config = config or LocalConfig()
        self._name = name
        self._path = self.config.model_path
        if self._path is None:  # named from the start, as LocalBackend is
            with contextlib.suppress(ModelNotFound):
                self._path = default_model_path()
        self._state: LoadState = "idle"
        self._detail = "not loaded"
        self._said: EngineState | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._errors: StderrTail | None = None
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._streams: dict[int, asyncio.Queue[list[Event] | None]] = {}
        self._ready: asyncio.Future[EngineState] | None = None
        self._start_task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._crashed = False
        #: the reader thread's view of the child: when it last heard from it (monotonic
        #: seconds), whether it has said it is alive, and why it killed it (a hang)
        self._heard = time.monotonic()
        self._alive = False
        self._hung_s: float | None = None
        #: no answer in flight in the child (cleared by a stream, set at its end)
        self._idle = threading.Event()
        self._idle.set()
        #: the model file as the last load saw it (a failed load is retried once it changes)
        self._stamp: tuple[int, int] | None = None
        #: when the last answer was cancelled (monotonic seconds)
        self._cancelled = 0.0

    # -- identity and state ---------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def model(self) -> str:
        if self._said is not None:
            return self._said.model
        return self._path.name if self._path else "(default model)"

    @property
    def model_path(self) -> Path | None:
        return self._said.model_path if self._said else self._path

    @property
    def state(self) -> LoadState:
        return self._state

    @property
    def state_detail(self) -> str:
        return self._detail

    @property
    def shares_cpu(self) -> bool:
        """On this machine's CPU unless every layer is on a GPU: the engine's Python runs
        in its own process, so only the cores are shared, not the interpreter lock."""
        return self.gpu_layers != -1

    # what the child's engine last said of itself (`LocalEngine`'s properties, as typed
    # there), each with its value before the first load
    geometry = _Said[Geometry | None](lambda s: s.geometry, None)
    gpu_layers = _Said[int](lambda s: s.gpu_layers, 0)
    threads = _Said[int](lambda s: s.threads, 0)
    model_bytes = _Said[int](lambda s: s.model_bytes, 0)
    flash_attn = _Said[bool | None](lambda s: s.flash_attn, None)
    flash_note = _Said[str](lambda s: s.flash_note, "")

    @property
    def context_window(self) -> int | None:
        if self._said is not None and self._said.context_window:
            return self._said.context_window
        return self.config.n_ctx

    @property
    def context_source(self) -> str | None:
        return "llama.cpp n_ctx"

    @property
    def pid(self) -> int | None:
        """The engine process's id while it runs (for the tests and `doctor`)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    # -- the process ------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine process and load the model; safe to call more than once.
        After a crash it starts a new one (the model loads again)."""
        if self._start_task is None or (self._crashed and self._start_task.done()):
            self._crashed = False
            self._start_task = asyncio.ensure_future(self._spawn())
        await asyncio.shield(self._start_task)

    async def _spawn(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._state, self._detail = "loading", "starting the engine process"
        self._stamp = _file_stamp(self._path)
        ours, theirs = socket.socketpair()
        argv = [
            sys.executable,
            "-m",
            "phasechat.backends.local.engine_process",
            str(theirs.fileno()),
        ]

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # a pipe drained into a bounded tail: never the terminal the UI draws
                # on, never a file that grows without bound
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl+C in the terminal is the app's, not the engine's
            )

        try:
            self._proc = await loop.run_in_executor(None, spawn)
        except OSError as exc:
            ours.close()
            self._state, self._detail = "failed", f"the engine process did not start: {exc}"
            return
        finally:
            theirs.close()
        self._errors = StderrTail(self._proc)
        self._heard, self._alive, self._hung_s = time.monotonic(), False, None
        self._idle.set()
        conn = self._conn = Connection(ours.detach())
        self._ready = loop.create_future()
        self._send(("load", replace(self.config, own_process=False), self._name))
        threading.Thread(target=self._read, args=(conn,), name="engine-reader", daemon=True).start()
        self._detail = "loading model"
        with contextlib.suppress(EngineGone):
            self._update(await self._ready)

    def _send(self, message: tuple[Any, ...]) -> None:
        conn = self._conn
        if conn is None:
            raise EngineGone("the engine process is not running")
        try:
            with self._send_lock:
                conn.send(message)
        except (OSError, ValueError) as exc:
            raise EngineGone(f"the engine process is not running: {exc}") from None

    def _read(self, conn: Connection) -> None:
        """The reader thread: answers to calls are handed over here; the rest on the loop
        of the latest request (a caller may use a new event loop for each, as tests do).
        It is also the watchdog: a child silent for `HANG_S` is killed here."""
        proc = self._proc
        while True:
            try:
                if not conn.poll(HEARTBEAT_S):
                    self._watch(proc)
                    continue
                message = conn.recv()
            except (EOFError, OSError, ValueError):
                break
            self._heard = time.monotonic()
            if message[0] == "alive":
                self._alive = True
                continue
            if message[0] == "end":
                self._idle.set()
            if message[0] == "result":
                _, cid, ok, value = message
                slot = self._slots.pop(cid, None)
                if slot is not None:
                    slot.ok, slot.value = ok, value
                    slot.done.set()
            else:
                self._post(self._dispatch, message)
        for slot in list(self._slots.values()):
            slot.value = EngineGone("the engine process ended")
            slot.done.set()
        self._slots.clear()
        self._idle.set()
        self._post(self._gone, conn)

    def _watch(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Kill the child if it has been silent too long (once; its end is then read as
        any other: the socket closes, `_gone` names why)."""
        silent = time.monotonic() - self._heard
        if proc is None or self._hung_s is not None or proc.poll() is not None:
            return
        if overdue(silent, self._alive):
            self._hung_s = silent
            with contextlib.suppress(OSError):
                proc.kill()

    def _silent(self) -> float:
        """Seconds since the child last said anything (0 while none runs or it starts)."""
        if self._conn is None or not self._alive:
            return 0.0
        return time.monotonic() - self._heard

    def _end_hung(self, seconds: float) -> None:
        """Kill a child that has not answered for `seconds` (named as the watchdog's)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._hung_s = self._hung_s or seconds
            with contextlib.suppress(OSError):
                proc.kill()

    def _post(self, handler: Any, message: Any) -> None:
        """Run `handler(message)` on the loop of the latest request."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(handler, message)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message[1])
        elif kind == "events":
            queue = self._streams.get(message[1])
            if queue is not None:
                queue.put_nowait(message[2])
        elif kind == "end":
            self._update(message[2])
            queue = self._streams.get(message[1])
            if queue is not None:
                queue.put_nowait(None)

    def _update(self, said: EngineState) -> None:
        self._said = said
        self._state, self._detail = said.state, said.detail

    def _gone(self, conn: Connection) -> None:
        """The child's end of the socket closed: a crash, unless we closed it."""
        if conn is not self._conn:
            return
        self._conn = None
        with contextlib.suppress(OSError):
            conn.close()
        if self._state == "idle":  # aclose
            return
        why = self._why()
        self._crashed = True
        self._state = "failed"
        self._detail = send_again(why, hung=self._hung_s is not None)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineGone(why))
        for queue in self._streams.values():
            queue.put_nowait([StreamError("model", why)])
            queue.put_nowait(None)

    def _why(self) -> str:
        """How the child ended, and the last line it wrote to stderr."""
        proc = self._proc
        code = None
        if proc is not None:  # reaped: never left a zombie
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=2)
        if self._hung_s is not None:
            return silent_end(self._hung_s)
        return ended(code, self._errors.last_line() if self._errors is not None else "")

    async def aclose(self) -> None:
        """Close the model and end the engine process (killed if it does not end)."""
        proc, self._state, self._detail = self._proc, "idle", "closed"
        if proc is None:
            return
        loop = asyncio.get_running_loop()
        if self._silent() > SILENT_S:  # it would not read the request: no wait
            proc.kill()
        else:
            with contextlib.suppress(EngineGone):
                self._send(("close",))
        try:
            await loop.run_in_executor(None, proc.wait, CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await loop.run_in_executor(None, proc.wait)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
        self._errors = None
        self._proc = None
        self._start_task = None

    # -- calls ----------------------------------------------------------------------
    def _call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """Call the child's backend and wait for its answer (blocking this thread): at
        most `timeout`, and no longer than the child stays silent `SILENT_S`."""
        if self._silent() > SILENT_S:
            raise EngineGone(f"the engine has not answered for {self._silent():.0f} s")
        cid = next(self._ids)
        slot = self._slots[cid] = _Slot()
        self._send(("call", cid, method, args))
        deadline = time.monotonic() + timeout
        while not slot.done.wait(0.05):
            if time.monotonic() > deadline or self._silent() > SILENT_S:
                self._slots.pop(cid, None)
                raise EngineGone(f"the engine did not answer {method} in {timeout:.0f} s")
        if not slot.ok:
            raise slot.value
        return slot.value

    async def _acall(self, method: str, *args: Any) -> Any:
        """`_call` without blocking the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, lambda: self._call(method, *args, timeout=ASYNC_CALL_TIMEOUT_S)
        )

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        if self._state == "ready":
            with contextlib.suppress(EngineGone):
                count: TokenCount = self._call("count_tokens", messages)
                return count
        from phasechat.backends.tokens import estimate_messages

        return TokenCount(estimate_messages(messages), estimated=True)

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        """Tokens of this prompt the engine's KV cache holds (None: not loaded, or gone)."""
        if self._state != "ready":
            return None
        try:
            held: int | None = self._call("cached_prefix", messages)
        except EngineGone:
            return None
        return held

    async def warm(self, messages: tuple[Message, ...]) -> int:
        if self._state != "ready":
            return 0
        try:
            evaluated: int = await self._acall("warm", messages)
        except EngineGone:
            return 0
        return evaluated

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        if self._state != "ready":
            return None
        try:
            rendered: RenderedPrompt | None = await self._acall("render", messages)
        except EngineGone:
            return None
        return rendered

    async def prompt_ids(self, messages: tuple[Message, ...]) -> list[int] | None:
        """The prompt's token ids as the child's model reads them (None: not loaded,
        refused by the template, or the engine is gone)."""
        if self._state != "ready":
            return None
        try:
            ids: list[int] | None = await self._acall("prompt_ids", messages)
        except EngineGone:
            return None
        return ids

    # -- generation -------------------------------------------------------------------
    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        """Stream one answer from the engine process; closing the iterator stops it at
        the next token (and waits until the engine is free for the next request)."""
        if self._proc is not None and self._proc.poll() is not None and self._conn is not None:
            self._gone(self._conn)  # it ended while no loop listened
        await self._free()
        if self._state == "failed" and not self._crashed and self._changed():
            await self.aclose()  # the model file changed since the load failed: again
        if self._state != "ready":
            loads = waits_for_load(self._state, self._crashed, self._start_task is not None)
            if loads:
                # The wait for the model is its own phase (the recorder keeps it out of
                # the prefill), as in LocalBackend.
                yield ModelLoading()
            await self.start()  # loads, or loads again after a crash
            if self.state != "ready":  # the property: the load changed it meanwhile
                yield StreamError("model", f"local model not ready: {self._detail}")
                return
            if loads:
                yield ModelLoaded(self._said.ready_ns if self._said else None)
        self._loop = asyncio.get_running_loop()
        rid = next(self._ids)
        queue: asyncio.Queue[list[Event] | None] = asyncio.Queue()
        self._streams[rid] = queue
        ended = False
        try:
            try:
                self._idle.clear()
                self._send(("stream", rid, request, every_s))
            except EngineGone as exc:
                self._idle.set()
                yield StreamError("model", str(exc))
                return
            while (batch := await queue.get()) is not None:
                for event in batch:
                    yield event
            ended = True
        finally:
            self._streams.pop(rid, None)
            if not ended:
                self._cancelled = time.monotonic()
                with contextlib.suppress(EngineGone):
                    self._send(("cancel", rid))
                # A moment for the child to stop at its next token; one that does not
                # is waited for by the next send (`_free`), never here: Esc ends the
                # answer at once whatever the child does.
                await asyncio.shield(self._until_idle(CANCEL_WAIT_S))

    async def _until_idle(self, limit_s: float) -> bool:
        """Wait (polling: the reader thread sets it) until no answer is in flight in the
        child, at most `limit_s` and not while it is silent; whether it is."""
        deadline = time.monotonic() + limit_s
        while not self._idle.is_set():
            if time.monotonic() > deadline or self._silent() > SILENT_S:
                return False
            await asyncio.sleep(0.02)
        return True

    async def _free(self) -> None:
        """Before a send: the last answer, if cancelled and not yet ended, ended; a child
        that does not end it (or is silent) is killed, named, and a new one started."""
        conn = self._conn
        if conn is None or self._proc is None:
            return
        if self._silent() <= SILENT_S and await self._until_idle(DRAIN_TIMEOUT_S):
            return
        if self._silent() <= SILENT_S and self._idle.is_set():
            return
        # not answered for: its silence, or (an answer cancelled and never ended) since the
        # cancel; never since 0.0, which named the machine's uptime ("did not answer for
        # 23359 s") when a send found the child silent and nothing cancelled
        unanswered = self._silent()
        if not self._idle.is_set():
            unanswered = max(unanswered, time.monotonic() - self._cancelled)
        self._end_hung(unanswered)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await loop.run_in_executor(None, self._proc.wait, CLOSE_TIMEOUT_S)
        self._gone(conn)  # now, not when the reader's word reaches this loop

    def _changed(self) -> bool:
        """Whether the model file is not as the last load saw it (size, change time)."""
        return _file_stamp(self._path) != self._stamp


# -- the protocol's arithmetic and words (pure: tests/test_engine_protocol.py) ----------
def overdue(silent_s: float, alive: bool) -> bool:
    """Whether a child silent for `silent_s` is to be killed: `HANG_S` once it has said
    it is alive, `START_S` while it has not (still importing)."""
    return silent_s > (HANG_S if alive else START_S)


def silent_end(silent_s: float) -> str:
    """The end of a child the watchdog killed, in words."""
    return f"the engine did not answer for {silent_s:.0f} s: ended"


def ended(code: int | None, last_line: str) -> str:
    """The end of a child that exited (`code`: its status, negative for a signal; None
    if it could not be read), with the last line it wrote to stderr."""
    if code is None:
        how = "no exit status"
    elif code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exit status {code}"
    how = f"{how}: {last_line}" if last_line else how
    return f"the engine process ended ({how})"


def send_again(why: str, *, hung: bool) -> str:
    """The engine's state after its child ended: why, and what the user does next.
    "...(killed by SIGKILL): send again", "...did not answer for 5 s: ended; send again"."""
    mark = ";" if hung else ":"
    return f"{why}{mark} send again to load the model again"


def waits_for_load(state: LoadState, crashed: bool, started: bool) -> bool:
    """Whether a send to an engine that is not ready waits for a load (its own phase,
    `ModelLoading`, kept out of TTFT and prefill): one under way, the reload after a
    crash, or the first; not a load that failed and is not tried again."""
    return state == "loading" or crashed or not started


def _file_stamp(path: Path | None) -> tuple[int, int] | None:
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if st is not None else None


# -- the child --------------------------------------------------------------------------
#: what the parent may call on the child's backend, and nothing else
CALLS = frozenset({"count_tokens", "cached_prefix", "warm", "render", "prompt_ids"})


async def serve(conn: Connection) -> None:
    """The child's side: load, then answer the parent's messages until it closes."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with lock, contextlib.suppress(OSError, ValueError):
            conn.send(message)

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = ("close",)  # the parent is gone: so is the engine
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] == "close":
                return

    def beat() -> None:  # a thread of its own: alive while the loop or llama.cpp is busy
        while True:
            time.sleep(HEARTBEAT_S)
            send(("alive",))

    threading.Thread(target=beat, name="engine-alive", daemon=True).start()
    _, config, name = conn.recv()
    backend = LocalBackend(config, name)
    threading.Thread(target=read, name="engine-inbox", daemon=True).start()
    await backend.start()
    send(("ready", state_of(backend)))
    tasks: dict[int, asyncio.Task[None]] = {}
    background: set[asyncio.Task[None]] = set()

    async def run(rid: int, request: GenerationRequest, every_s: float | None) -> None:
        batches = backend.batches(request, every_s=every_s)
        try:
            async for batch in batches:
                send(("events", rid, batch))
            await batches.aclose()
        except asyncio.CancelledError:
            await batches.aclose()  # stops the llama thread (also if cancelled between batches)
            pass  # the generator stopped the llama thread on its way out
        except Exception as exc:  # a defect here: the answer fails, the engine stays up
            send(("events", rid, [StreamError("model", f"engine process: {exc}")]))
        finally:
            tasks.pop(rid, None)
            send(("end", rid, state_of(backend)))

    async def call(cid: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method not in CALLS:
                raise ValueError(f"not an engine call: {method}")
            value = getattr(backend, method)(*args)
            if asyncio.iscoroutine(value):
                value = await value
            send(("result", cid, True, value))
        except Exception as exc:
            send(("result", cid, False, exc))

    while True:
        message = await inbox.get()
        kind = message[0]
        if kind == "stream":
            _, rid, request, every_s = message
            tasks[rid] = asyncio.create_task(run(rid, request, every_s))
        elif kind == "cancel":
            task = tasks.get(message[1])
            if task is not None:
                task.cancel()
        elif kind == "call":
            _, cid, method, args = message
            if method in ("warm", "render", "prompt_ids"):  # the llama thread: after any answer
                task = asyncio.create_task(call(cid, method, args))
                background.add(task)
                task.add_done_callback(background.discard)
            else:
                await call(cid, method, args)
        elif kind == "close":
            for task in list(tasks.values()):
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await backend.aclose()
            return


if __name__ == "__main__":
    # Run as `python -m`: this file is `__main__` here, so what the parent unpickles
    # (an `EngineState`) must come from the module under its own name.
    from phasechat.backends.local import engine_process

    asyncio.run(engine_process.serve(Connection(int(sys.argv[1]))))
