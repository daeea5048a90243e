"""A scripted engine for the engine process's child (backends/local/engine_process.py),
for tests of its protocol that need no model: `install()` puts `ScriptedEngine` where
`serve` builds its `LocalBackend`, so the real child (`python -m
phasechat.backends.local.engine_process`, the real `serve`, the real wire) answers without
llama.cpp, in a fraction of a second.

It loads at once (its stdout written to, as llama.cpp's loader may: the terminal the UI
draws on must never see it). What it does is read from what it is given, so a test says
it in the request:
- a model file that starts with `FAIL` fails to load, with `LOAD_FAILED` as its words;
- a last user message `crash` writes `CRASH_STDERR` and exits with status 3 (a loader or
  a llama.cpp abort, with its own words last); `stop` sends one token and stops itself
  (SIGSTOP: a wedged driver call); `slow` sends a word every 20 ms until cancelled;
  `raise` sends a token and raises (a defect in the engine's code); `linger` shuts its
  end of the socket and exits (status 0) `LINGER_S` later; `every` answers the hand-over
  interval it was given (`every_s`), as its one word; `deaf` sends a word every 20 ms
  and never hears a cancel (a llama.cpp call that does not return); `die` sends a word,
  then exits with `CRASH_STATUS` 50 ms later, without a word on stderr;
  anything else is answered with its own words, two to a batch, then `Finished("stop")`.
- `count_tokens` counts words (of `block`: after holding the loop `BLOCK_S`; of `hold`,
  `HOLD_S`; of `unpicklable`, it answers what cannot be sent: a ctypes pointer; of `die`,
  it exits with `CRASH_STATUS`, the call unanswered; of `linger`, as an answer of it);
  `cached_prefix` is the last answer's prompt in words; `warm` (of `slow warm`: after
  `WARM_S`) and `prompt_ids` answer from the words too; `render` has no template (None)
  but for `templated` (`TEMPLATED`);
  `warm`, `render` and `prompt_ids` of `later` answer after `LATER_S` (the loop free).
- closed while an answer runs, it raises (llama.cpp would free the model under it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path

from phasechat.backends.base import LoadState, RenderedPrompt, TokenCount
from phasechat.backends.events import Event, Finished, GenerationRequest, Message, TextDelta
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.gguf import Geometry

LOAD_FAILED = "scripted: not a model file"
#: the crash's stderr: the last non-empty line is the one a crash message quotes
CRASH_STDERR = "first: the loader starts\nsecond: a middle line\n\nthe last words\n\n"
CRASH_STATUS = 3
#: how long a count of `block` holds the child's loop (its heartbeat goes on)
BLOCK_S = 4.0
#: how long a warm of `slow warm` takes (longer than a count may wait, not a warm)
WARM_S = 2.5
#: how long a child whose socket is shut lives on (longer than the parent waits for its
#: exit status, 2 s; shorter than 3)
LINGER_S = 2.5
#: how long a count of `hold` holds the child's loop (what the parent sends meanwhile
#: waits in its inbox)
HOLD_S = 1.0
#: how long a warm, render or prompt_ids of `later` takes (its loop free meanwhile)
LATER_S = 1.0


def words(messages: tuple[Message, ...]) -> list[str]:
    return [w for m in messages for w in m.content.split()]


def linger() -> None:
    """Its end of the socket shut, the process on for `LINGER_S` (the loop held: nothing
    of serve's runs meanwhile), then its exit, status 0."""
    wire = socket.socket(fileno=os.dup(int(sys.argv[-1])))
    wire.shutdown(socket.SHUT_RDWR)
    wire.close()
    time.sleep(LINGER_S)
    os._exit(0)


#: what `render` answers for `templated` (anything else has no template: None)
TEMPLATED = RenderedPrompt("<t>templated</t>", (b"<t>", b"templated", b"</t>"), "tokenizer")


async def later(messages: tuple[Message, ...]) -> None:
    if messages and messages[-1].content == "later":
        await asyncio.sleep(LATER_S)


class ScriptedEngine:
    """What `serve` asks of a `LocalBackend`, scripted (see the module's docstring)."""

    def __init__(self, config: LocalConfig | None = None, name: str = "local") -> None:
        self.config = config or LocalConfig()
        self.name = name
        self.state: LoadState = "idle"
        self.state_detail = "not loaded"
        path = self.config.model_path
        self.model = path.name if path is not None else "(none)"
        self.model_path: Path | None = path
        self.context_window: int | None = None
        self.geometry: Geometry | None = None
        self.gpu_layers = self.config.gpu_layers if self.config.gpu_layers is not None else 0
        self.threads = self.config.threads or 1
        self.model_bytes = 0
        self.flash_note = "scripted: no flash measurement"
        self.ready_ns: int | None = None
        self.flash_attn: bool | None = None
        self._held = 0
        #: answers under way (llama.cpp's model may not be freed under one)
        self._running = 0

    async def start(self) -> None:
        path = self.model_path
        data = path.read_bytes() if path is not None else b""
        if data.startswith(b"FAIL"):
            self.state, self.state_detail = "failed", LOAD_FAILED
            return
        print("scripted: words on stdout, never the terminal's", flush=True)
        self.state, self.state_detail = "ready", f"scripted {self.model}"
        if self.config.own_process:  # the child's engine is a plain one: no third process
            self.state_detail += ", asked for a process of its own"
        self.context_window = self.config.n_ctx
        self.model_bytes = len(data)
        self.flash_attn = bool(self.config.flash_attn)
        self.ready_ns = time.perf_counter_ns()

    async def batches(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncGenerator[list[Event], None]:
        self._running += 1
        try:
            async for batch in self._answer(request, every_s):
                yield batch
        finally:
            self._running -= 1

    async def _answer(
        self, request: GenerationRequest, every_s: float | None
    ) -> AsyncGenerator[list[Event], None]:
        said = words(request.messages)
        self._held = len(said)
        last = request.messages[-1].content
        if last == "crash":
            sys.stderr.write(CRASH_STDERR)
            sys.stderr.flush()
            os._exit(CRASH_STATUS)
        if last == "stop":
            yield [TextDelta("one", 1, time.perf_counter_ns())]
            await asyncio.sleep(0.05)  # the batch on its way before the stop
            os.kill(os.getpid(), signal.SIGSTOP)
        if last == "linger":
            linger()
        if last == "raise":  # a defect in the engine: the answer fails, the engine stays up
            yield [TextDelta("half", 1, time.perf_counter_ns())]
            raise RuntimeError("scripted defect")
        if last == "every":
            yield [TextDelta(f" {every_s}", 1, time.perf_counter_ns())]
            yield [Finished("stop")]
            return
        if last == "die":
            yield [TextDelta(" half", 1, time.perf_counter_ns())]
            await asyncio.sleep(0.05)  # the batch on its way before the end
            os._exit(CRASH_STATUS)
        if last == "deaf":
            for i in range(request.max_tokens):
                yield [TextDelta(f" d{i}", 1, time.perf_counter_ns())]
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.02)
            yield [Finished("length")]
            return
        if last == "slow":
            for i in range(request.max_tokens):
                yield [TextDelta(f" w{i}", 1, time.perf_counter_ns())]
                await asyncio.sleep(0.02)
            yield [Finished("length")]
            return
        for i in range(0, len(said), 2):
            yield [TextDelta(f" {w}", 1, time.perf_counter_ns()) for w in said[i : i + 2]]
        yield [Finished("stop")]

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        last = messages[-1].content if messages else ""
        if last in ("block", "hold"):  # the loop held, the heartbeat not
            time.sleep(BLOCK_S if last == "block" else HOLD_S)
        if last == "die":
            os._exit(CRASH_STATUS)
        if last == "linger":
            linger()
        if messages and messages[-1].content == "unpicklable":  # pickle raises ValueError
            return ctypes.pointer(ctypes.c_int(1))  # type: ignore[return-value]
        return TokenCount(len(words(messages)), estimated=False)

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        return min(self._held, len(words(messages)))

    async def warm(self, messages: tuple[Message, ...]) -> int:
        if messages and messages[-1].content == "slow warm":
            await asyncio.sleep(WARM_S)
        await later(messages)
        self._held = len(words(messages))
        return self._held

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        await later(messages)
        if words(messages) == ["templated"]:
            return TEMPLATED
        return None

    async def prompt_ids(self, messages: tuple[Message, ...]) -> list[int] | None:
        await later(messages)
        return [len(w) for w in words(messages)]

    async def aclose(self) -> None:
        if self._running:  # llama.cpp would free the model under the answer's decode
            raise RuntimeError("scripted: closed while an answer runs")
        self.state, self.state_detail = "idle", "closed"


def install() -> None:
    """Make `serve` build a `ScriptedEngine` (in the child, from its sitecustomize)."""
    import warnings

    from phasechat.backends.local import engine_process

    # imported before `-m` runs it (as `__main__`, which imports it again by its name):
    # runpy's warning would be the child's last stderr line, which a crash message quotes
    warnings.filterwarnings("ignore", "'phasechat.backends", RuntimeWarning)
    setattr(engine_process, "LocalBackend", ScriptedEngine)  # noqa: B010 - replaced, as a test does
