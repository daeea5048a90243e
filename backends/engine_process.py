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

The wire: `multiprocessing.connection.Connection` over a socket pair (pickles, each
message whole). Parent -> child: ("load", config, name), ("stream", id, request,
every_s), ("cancel", id), ("call", id, method, args), ("close",). Child -> parent:
("ready", snapshot), ("events", id, [event, ...]), ("end", id, snapshot),
("result", id, ok, value). Only the parent's own messages are trusted: the child is
this program, run by this program.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from phasechat.backends.base import LoadState, RenderedPrompt, TokenCount
from phasechat.backends.events import (
    Event,
    GenerationRequest,
    Message,
    ModelLoaded,
    ModelLoading,
    StreamError,
)
from phasechat.backends.gguf import Geometry
from phasechat.backends.local import LocalBackend, LocalConfig
from phasechat.backends.models import ModelNotFound, default_model_path

#: how long a call the UI waits on (a token count) may take before it is estimated
CALL_TIMEOUT_S = 30.0
#: how long a closing child gets before it is killed
CLOSE_TIMEOUT_S = 10.0
#: how long a cancelled stream's child may take to free the context
CANCEL_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Snapshot:
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


def snapshot(backend: LocalBackend) -> Snapshot:
    """The child's backend, as the parent shows it."""
    return Snapshot(
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


class EngineProcess:
    """A `Backend`: the local model in a child process (see the module's docstring)."""

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
        self._snap: Snapshot | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._errors: IO[bytes] | None = None
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._streams: dict[int, asyncio.Queue[list[Event] | None]] = {}
        self._ready: asyncio.Future[Snapshot] | None = None
        self._start_task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._crashed = False

    # -- identity and state ---------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def model(self) -> str:
        if self._snap is not None:
            return self._snap.model
        return self._path.name if self._path else "(default model)"

    @property
    def model_path(self) -> Path | None:
        return self._snap.model_path if self._snap else self._path

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

    @property
    def geometry(self) -> Geometry | None:
        return self._snap.geometry if self._snap else None

    @property
    def gpu_layers(self) -> int:
        return self._snap.gpu_layers if self._snap else 0

    @property
    def threads(self) -> int:
        return self._snap.threads if self._snap else 0

    @property
    def model_bytes(self) -> int:
        return self._snap.model_bytes if self._snap else 0

    @property
    def flash_attn(self) -> bool | None:
        return self._snap.flash_attn if self._snap else None

    @property
    def flash_note(self) -> str:
        return self._snap.flash_note if self._snap else ""

    @property
    def context_window(self) -> int | None:
        if self._snap is not None and self._snap.context_window:
            return self._snap.context_window
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
        ours, theirs = socket.socketpair()
        # The child's stderr goes to a file, never the terminal the UI draws on; its
        # last lines explain a crash.
        errors = self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (the child's life)
        argv = [sys.executable, "-m", "phasechat.backends.engine_process", str(theirs.fileno())]

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
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
        of the latest request (a caller may use a new event loop for each, as tests do)."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
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
        self._post(self._gone, conn)

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

    def _update(self, snap: Snapshot) -> None:
        self._snap = snap
        self._state, self._detail = snap.state, snap.detail

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
        self._detail = f"the engine process ended ({why}): send again to load the model again"
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineGone(why))
        for queue in self._streams.values():
            queue.put_nowait([StreamError("model", f"the engine process ended ({why})")])
            queue.put_nowait(None)

    def _why(self) -> str:
        """How the child ended, and the last line it wrote to stderr."""
        proc = self._proc
        code = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=2)
        if code is None:
            how = "no exit status"
        elif code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit status {code}"
        last = _last_line(self._errors)
        return f"{how}: {last}" if last else how

    async def aclose(self) -> None:
        """Close the model and end the engine process (killed if it does not end)."""
        proc, self._state, self._detail = self._proc, "idle", "closed"
        if proc is None:
            return
        with contextlib.suppress(EngineGone):
            self._send(("close",))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, proc.wait, CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await loop.run_in_executor(None, proc.wait)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
        if self._errors is not None:
            self._errors.close()
            self._errors = None
        self._proc = None
        self._start_task = None

    # -- calls ----------------------------------------------------------------------
    def _call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """Call the child's backend and wait for its answer (blocking this thread)."""
        cid = next(self._ids)
        slot = self._slots[cid] = _Slot()
        self._send(("call", cid, method, args))
        if not slot.done.wait(timeout):
            self._slots.pop(cid, None)
            raise EngineGone(f"the engine did not answer {method} in {timeout:.0f} s")
        if not slot.ok:
            raise slot.value
        return slot.value

    async def _acall(self, method: str, *args: Any) -> Any:
        """`_call` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self._call, method, *args)

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
        if self._state != "ready":
            loads = self._state == "loading" or self._crashed or self._start_task is None
            if loads:
                # The wait for the model is its own phase (the recorder keeps it out of
                # the prefill), as in LocalBackend.
                yield ModelLoading()
            await self.start()  # loads, or loads again after a crash
            if self.state != "ready":  # the property: the load changed it meanwhile
                yield StreamError("model", f"local model not ready: {self._detail}")
                return
            if loads:
                yield ModelLoaded(self._snap.ready_ns if self._snap else None)
        self._loop = asyncio.get_running_loop()
        rid = next(self._ids)
        queue: asyncio.Queue[list[Event] | None] = asyncio.Queue()
        self._streams[rid] = queue
        ended = False
        try:
            try:
                self._send(("stream", rid, request, every_s))
            except EngineGone as exc:
                yield StreamError("model", str(exc))
                return
            while (batch := await queue.get()) is not None:
                for event in batch:
                    yield event
            ended = True
        finally:
            if not ended:
                with contextlib.suppress(EngineGone):
                    self._send(("cancel", rid))
                with contextlib.suppress(TimeoutError):
                    # the context is busy until the child has stopped its thread
                    await asyncio.shield(_until_end(queue, CANCEL_TIMEOUT_S))
            self._streams.pop(rid, None)


async def _until_end(queue: asyncio.Queue[list[Event] | None], limit_s: float) -> None:
    async with asyncio.timeout(limit_s):
        while await queue.get() is not None:
            pass


def _last_line(f: IO[bytes] | None) -> str:
    """The last non-empty line of the child's stderr, shown as text (at most 200 chars)."""
    if f is None:
        return ""
    try:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        tail = f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


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

    _, config, name = conn.recv()
    backend = LocalBackend(config, name)
    threading.Thread(target=read, name="engine-inbox", daemon=True).start()
    await backend.start()
    send(("ready", snapshot(backend)))
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
            send(("end", rid, snapshot(backend)))

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
    # (a `Snapshot`) must come from the module under its own name.
    from phasechat.backends import engine_process

    asyncio.run(engine_process.serve(Connection(int(sys.argv[1]))))
