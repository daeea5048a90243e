"""A server on 127.0.0.1 that replays one family's fixtures (tests/fixtures/servers/
<family>/) over real HTTP, so the real RemoteBackend reads them as it reads a server:

- `models.json`: the `GET /v1/models` listing (by its `owned_by`, the family);
- `stream.sse`: the chat completion's body, an event per write, the first after `pace_s`
  (the server's wait before its first token: longer than the times the fixture claims,
  so that they fit in the TTFT measured here);
- or `reply.json`: a reply sent whole (a server that does not stream), after `pace_s`
  with the headers (which then say what the server measured of the whole);
- `headers.json` (optional): the chat response's headers, under `headers`;
- `metrics-*.txt` (optional): the Prometheus page, at any path ending in `metrics`,
  each read the next file in name order (then the last again); without one, a 404.

Every request's path is kept in `paths`, every chat request's JSON in `requests`.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from phasechat.backends.events import Event, GenerationRequest, Message
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.telemetry.recorder import Trace, record

REQUEST = GenerationRequest((Message("user", "Why is the sky blue?"),), max_tokens=64)


def _response(status: int, body: bytes, ctype: str) -> bytes:
    head = (
        f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\n"
        f"content-type: {ctype}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class FamilyServer:
    """`async with FamilyServer(folder) as s:` then point a backend at `s.base_url`."""

    def __init__(self, folder: Path, pace_s: float = 0.3) -> None:
        self.folder = folder
        self.pace_s = pace_s
        self.port = 0
        self.paths: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self._reads = 0
        self._server: asyncio.base_events.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FamilyServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            path = head[0].split(" ")[1]
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (h.partition(":") for h in head[1:] if h)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.paths.append(path)
            if path.endswith("/models"):
                writer.write(
                    _response(200, (self.folder / "models.json").read_bytes(), "application/json")
                )
            elif path.endswith("metrics"):
                pages = sorted(self.folder.glob("metrics-*.txt"))
                if pages:
                    page = pages[min(self._reads, len(pages) - 1)].read_bytes()
                    self._reads += 1
                    writer.write(_response(200, page, "text/plain; version=0.0.4"))
                else:
                    writer.write(_response(404, b"not found", "text/plain"))
            elif path.endswith("/chat/completions"):
                self.requests.append(json.loads(body))
                await self._stream(writer)
            else:
                writer.write(_response(404, b"not found", "text/plain"))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        extra = ""
        said = self.folder / "headers.json"
        if said.exists():
            for name, value in json.loads(said.read_text())["headers"].items():
                extra += f"{name}: {value}\r\n"
        whole = self.folder / "reply.json"
        if whole.exists():
            await asyncio.sleep(self.pace_s)
            body = whole.read_bytes()
            writer.write(
                (
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
                ).encode()
                + body
            )
            return
        writer.write(
            (
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                f"cache-control: no-cache\r\nconnection: close\r\n{extra}\r\n"
            ).encode()
        )
        await writer.drain()
        await asyncio.sleep(self.pace_s)
        text = (self.folder / "stream.sse").read_text()
        for event in text.strip().split("\n\n"):
            writer.write((event + "\n\n").encode())
            await writer.drain()
            await asyncio.sleep(0.002)


async def replay(folder: Path, pace_s: float = 0.3) -> tuple[list[Event], Metrics, FamilyServer]:
    """One answer from `folder`'s recordings through the real backend and recorder:
    its events, its metrics and the server (what it was asked)."""
    async with FamilyServer(folder, pace_s) as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url))
        await backend.start()
        assert backend.state == "ready", backend.state_detail
        trace = Trace("openai", backend.model, window=backend.context_window)
        events = [e async for e in record(backend.stream(REQUEST), trace)]
        await backend.aclose()
    return events, compute(trace), server
