"""A scripted OpenAI-compatible server on 127.0.0.1, for what a real one won't do on demand.

The request's `model` field picks the behaviour: HTTP errors, non-streamed replies,
malformed or split events, stalls, resets, endless or 10 MB streams, and streams faster
than any real model. Used by tests and by the UI-ingest benchmark; it answers only on
loopback and every behaviour ends by itself or when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

Writer = asyncio.StreamWriter


def chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj: dict[str, Any] = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE_CHUNK = (
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":0}}\n\n'
)
DONE = b"data: [DONE]\n\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"connection: close\r\n\r\n"
)


def http(status: int, body: bytes, ctype: str = "application/json", extra: str = "") -> bytes:
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\ncontent-type: {ctype}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


class FaultServer:
    """`async with FaultServer() as s:` then point a backend at `s.base_url`."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.open_connections = 0
        self.tokens_sent = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FaultServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        self.open_connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            self.headers.append(headers)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if path.endswith("/models"):
                writer.write(http(200, b'{"object":"list","data":[{"id":"scripted"}]}'))
            else:
                request = json.loads(body or b"{}")
                self.requests.append(request)
                behaviour = str(request.get("model", "ok-5"))
                await self._behave(behaviour, request, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()

    async def _behave(self, behaviour: str, request: dict[str, Any], w: Writer) -> None:
        name, _, arg = behaviour.partition("-")
        handler: Callable[[str, dict[str, Any], Writer], Awaitable[None]] = getattr(
            self, f"_b_{name}"
        )
        await handler(arg, request, w)

    async def _tokens(self, w: Writer, n: int, delay: float = 0.0, text: str = "tok ") -> None:
        for _ in range(n):
            w.write(chunk(text))
            self.tokens_sent += 1
            if delay:
                await w.drain()
                await asyncio.sleep(delay)

    # -- behaviours: the part of `model` before the first "-" -----------------------
    async def _b_ok(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        n = int(arg or 5)
        w.write(SSE_HEAD)
        await self._tokens(w, n, delay=0.001)
        w.write(chunk(finish="stop") + USAGE_CHUNK % n + DONE)

    async def _b_fast(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        """N one-token chunks as fast as the socket takes them."""
        n = int(arg or 20000)
        w.write(SSE_HEAD)
        for i in range(n):
            w.write(chunk(f"t{i} "))
            if i % 512 == 0:
                await w.drain()
        self.tokens_sent += n
        w.write(chunk(finish="stop") + USAGE_CHUNK % n + DONE)

    async def _b_status(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        status = int(arg)
        extra = "retry-after: 7\r\n" if status == 429 else ""
        body = json.dumps({"error": {"message": f"scripted {status}", "type": "x"}}).encode()
        w.write(http(status, body, extra=extra))

    async def _b_json(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        body = {
            "choices": [
                {
                    "message": {"role": "assistant", "content": "whole answer"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        }
        w.write(http(200, json.dumps(body).encode()))

    async def _b_html(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(http(200, b"<html>proxy login</html>", ctype="text/html"))

    async def _b_malformed(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(SSE_HEAD + chunk("ok ") + b"data: {not json\n\n" + DONE)

    async def _b_split(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        payload = SSE_HEAD + b"".join(chunk(t) for t in ["αβ", "γ ", "δ😀"])
        payload += b": keep-alive\n\n" + chunk(finish="stop") + DONE
        step = int(arg or 1)
        w.write(payload[: len(SSE_HEAD)])
        for i in range(len(SSE_HEAD), len(payload), step):
            w.write(payload[i : i + step])
            await w.drain()
            await asyncio.sleep(0)

    async def _b_keepalive(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(SSE_HEAD + b": ping\n\n" + chunk("a") + b":\n\n" + chunk("b"))
        w.write(chunk(finish="stop") + DONE)

    async def _b_nodone(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(SSE_HEAD + chunk("complete") + chunk(finish="stop"))

    async def _b_cut(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        """Tokens, then the connection closes cleanly with no finish and no [DONE]."""
        w.write(SSE_HEAD)
        await self._tokens(w, 3)

    async def _b_errormid(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(SSE_HEAD + chunk("par") + chunk("tial"))
        w.write(b'data: {"error":{"message":"model crashed","type":"server_error"}}\n\n')

    async def _b_stall(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(SSE_HEAD)
        await self._tokens(w, 3)
        await w.drain()
        await asyncio.sleep(float(arg or 30))

    async def _b_slowstart(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        """A long silent prefill, then a normal answer: not a stall."""
        w.write(SSE_HEAD)
        await w.drain()
        await asyncio.sleep(float(arg or 1))
        await self._tokens(w, 3, delay=0.001)
        w.write(chunk(finish="stop") + DONE)

    async def _b_reset(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        w.write(SSE_HEAD)
        await self._tokens(w, 3)
        await w.drain()
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        w.transport.abort()

    async def _b_endless(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        """Ignores max_tokens and never finishes: the client must stop it."""
        w.write(SSE_HEAD)
        for _ in range(1_000_000):
            w.write(chunk("more "))
            self.tokens_sent += 1
            await w.drain()
            await asyncio.sleep(0.0005)

    async def _b_huge(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        big = "x" * (10 * 1024 * 1024)
        w.write(SSE_HEAD + chunk(big) + chunk(finish="stop") + DONE)

    async def _b_markup(self, arg: str, req: dict[str, Any], w: Writer) -> None:
        pieces = [
            "[bold red]not bold[/] ",
            "[@click=app.quit]click[/] ",
            "\x1b[31mred\x1b[0m ",
            "\x1b]0;pwned title\x07",
            "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ ",
            "\x1b]52;c;cHduZWQ=\x07",
            "bell\x07 nul\x00 end",
        ]
        w.write(SSE_HEAD + b"".join(chunk(p) for p in pieces) + chunk(finish="stop") + DONE)
