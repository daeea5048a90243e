"""Stand-ins for servers that cannot run on this machine (SGLang, TGI, TensorRT-LLM,
Ollama): each is a real HTTP server on 127.0.0.1, written from that server's source at a
pinned commit, every behaviour it copies naming the file and function it copies (what
the real one sends, what it refuses, what it leaves out). The model behind them is
`engine.ToyEngine`, the same for all: what is under test is each server's wire, not its
model.

`serve(Kind, **options)` runs one in a process of its own, as a real server runs (its
clock apart from the client's, no lock shared with it), in uvicorn, with HTTP/1.1
keep-alive and chunked streaming as uvicorn does them (SGLang and trtllm-serve are
FastAPI apps in uvicorn themselves). What it said of each request (its own record, for a
test to hold phasechat's figures against) is at `GET /_standin/record`, a path of the
stand-in's own that phasechat never asks.
"""

from __future__ import annotations

import importlib
import multiprocessing
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import httpx

#: the stand-in's own path: what it said of each request, as JSON
RECORD = "/_standin/record"


@dataclass(frozen=True)
class Running:
    """A stand-in running at `root` (http://127.0.0.1:PORT)."""

    root: str

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def record(self) -> dict[str, Any]:
        """What the stand-in said of each request so far (its `record()`)."""
        said: dict[str, Any] = httpx.get(f"{self.root}{RECORD}", timeout=10).json()
        return said


def _run(kind: str, options: dict[str, Any], conn: Connection) -> None:
    """The child: build the stand-in, listen on a free port, say which, serve."""
    import uvicorn

    module, name = kind.split(":")
    standin = getattr(importlib.import_module(module), name)(**options)
    standin.app.get(RECORD)(standin.record)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    conn.send(sock.getsockname()[1])
    config = uvicorn.Config(standin.app, log_level="warning", lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def serve(kind: type, **options: Any) -> Iterator[Running]:
    """`with serve(SGLang, enable_metrics=False) as s:` then point a backend at
    `s.base_url`; the process is ended on leaving."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=_run, args=(f"{kind.__module__}:{kind.__qualname__}", options, child), daemon=True
    )
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError(f"the {kind.__name__} stand-in did not start")
        running = Running(f"http://127.0.0.1:{parent.recv()}")
        for _ in range(500):  # the port is bound: wait until uvicorn answers on it
            try:
                httpx.get(f"{running.root}{RECORD}", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.01)
        yield running
    finally:
        proc.terminate()
        proc.join(10)
