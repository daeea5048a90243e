"""A scripted OpenAI-compatible server on 127.0.0.1, for what a real one won't do on demand.

The request's `model` field picks the behaviour: HTTP errors, non-streamed replies,
malformed or split events, stalls, resets, endless or 10 MB streams, and streams faster
than any real model. Used by tests and by the UI-ingest benchmark; it answers only on
loopback and every behaviour ends by itself or as soon as the client goes away.

`model` is `name-arg`: `_b_<name>` handles it with `arg` (e.g. `stall-30`, `status-429`).
A base URL under `/window-<case>/` serves hostile window metadata (tests/fault_numbers.py);
under `/counts-<n>/` it says it is vLLM and serves a `/metrics` page that counts `n`
generated tokens per answer, whatever the answer's usage says. Routes ignore a query
(`...?api-version=X`, as Azure's); `paths` keeps each request's target as sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from email.utils import formatdate
from typing import Any

from tests.fault_numbers import NumberBehaviours
from tests.fault_think import DONE, SSE_HEAD, Conn, ThinkBehaviours, Writer


def chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj: dict[str, Any] = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    # Raw UTF-8 on the wire, as llama-server sends it, so a read can split a character.
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


USAGE_CHUNK = (
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":0}}\n\n'
)
#: What the `markup` behaviour sends: markup and terminal control a model might emit.
MARKUP_PIECES = (
    "[bold red]not bold[/] ",
    "[@click=app.quit]click[/] ",
    "\x1b[31mred\x1b[0m ",
    "\x9b31mc1red\x9b0m ",  # 8-bit CSI, which some terminals honour
    "\x1b]0;pwned title\x07",
    "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ ",
    "\x1b]52;c;cHduZWQ=\x07",
    "bell\x07 nul\x00 end",
)

#: The model id `/hostile/v1/models` lists: a window title, a clipboard write, markup.
HOSTILE_MODEL = "evil\x1b]0;pwned title\x07\x1b]52;c;cHduZWQ=\x07[/]\u202egnp.exe"
#: what a web server answers where the API was expected (a URL missing its port, a UI)
HTML_PAGE = b"<!doctype html><html><head><title>Welcome</title></head><body>hi</body></html>"


def http(status: int, body: bytes, ctype: str = "application/json", extra: str = "") -> bytes:
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\ncontent-type: {ctype}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


class FaultServer(ThinkBehaviours, NumberBehaviours):
    """`async with FaultServer() as s:` then point a backend at `s.base_url`.

    With `tls` (a server-side SSL context, e.g. a self-signed certificate) it speaks https.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.open_connections = 0
        self.tokens_sent = 0
        self.last_byte_ns = 0
        self.fast_requests = 0
        self.drip_cut = asyncio.Event()
        #: each request's target as it came (path and query)
        self.paths: list[str] = []
        #: the answers served under `/counts-<n>/` (what its /metrics page counts)
        self.counted_answers = 0

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FaultServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):  # a test that failed may have left one running
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open_connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, target, _ = lines[0].split(" ", 2)
            self.paths.append(target)
            path = target.partition("?")[0]
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            self.headers.append(headers)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if "/counts-" in path and not path.endswith("/chat/completions"):
                await self._counts(path, Conn(reader, writer, headers))
            elif "/window-" in path and not path.endswith("/chat/completions"):
                # metadata that lies about the window, or drips (tests/fault_numbers.py)
                case = path.split("/window-", 1)[1].split("/", 1)[0]
                await self._window(case, path, Conn(reader, writer, headers))
            elif path.endswith("/models"):
                # Under /hostile/ the only model's id is an attack on the terminal and on
                # markup; a chat request naming it gets a 404 that quotes it back.
                model = HOSTILE_MODEL if "/hostile/" in path else "scripted"
                listing = {"object": "list", "data": [{"id": model}]}
                if "/two-models/" in path:  # a server that serves several (Ollama, a proxy)
                    listing["data"] = [{"id": "ok-3"}, {"id": "ok-7"}]
                if "/hostile-models/" in path:  # markup and a name listed twice
                    listing["data"] = [{"id": "ok-3"}, {"id": HOSTILE_MODEL}, {"id": "ok-3"}]
                if "/html/" in path:  # a web page where the API was expected
                    writer.write(http(200, HTML_PAGE, "text/html"))
                else:
                    writer.write(http(200, json.dumps(listing).encode()))
            else:
                request = json.loads(body or b"{}")
                self.requests.append(request)
                self.counted_answers += int("/counts-" in path)
                behaviour = str(request.get("model", "ok-5"))
                await self._behave(behaviour, request, Conn(reader, writer, headers))
            await writer.drain()
        except (
            ConnectionError,
            ssl.SSLError,
            asyncio.IncompleteReadError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            writer.close()

    async def _behave(self, behaviour: str, request: dict[str, Any], c: Conn) -> None:
        if behaviour == HOSTILE_MODEL:  # the error body quotes the hostile id raw
            body = json.dumps({"error": {"message": f"unknown model {behaviour}"}}).encode()
            c.w.write(http(400, body))
            return
        name, _, arg = behaviour.partition("-")
        handler: Callable[[str, dict[str, Any], Conn], Awaitable[None]] | None = getattr(
            self, f"_b_{name}", None
        )
        if handler is None:
            body = json.dumps({"error": {"message": f"no behaviour {name!r}"}}).encode()
            c.w.write(http(404, body))
        else:
            await handler(arg, request, c)

    async def _tokens(self, w: Writer, n: int, delay: float = 0.0, text: str = "tok ") -> None:
        for _ in range(n):
            w.write(chunk(text))
            self.tokens_sent += 1
            if delay:
                await w.drain()
                await asyncio.sleep(delay)

    async def _counts(self, path: str, c: Conn) -> None:
        """Under `/counts-<n>/`: a vLLM listing, and a `/metrics` page (vLLM's names,
        nothing running) whose counters grow by one finished request and `n` generated
        tokens per answer served: a count the answer's usage contradicts."""
        n = int(path.split("/counts-", 1)[1].split("/", 1)[0])
        if path.endswith("/v1/models"):
            listing = {"object": "list", "data": [{"id": "scripted", "owned_by": "vllm"}]}
            c.w.write(http(200, json.dumps(listing).encode()))
        elif path.endswith("/metrics"):
            done = self.counted_answers
            page = (
                "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                f"vllm:e2e_request_latency_seconds_count {done}\n"
                f"vllm:prompt_tokens_total {5 * done}\n"
                f"vllm:generation_tokens_total {n * done}\n"
            )
            c.w.write(http(200, page.encode(), "text/plain; version=0.0.4"))
        else:
            c.w.write(http(404, b'{"error":{"message":"not served here"}}'))

    # -- behaviours: the part of `model` before the first "-" -----------------------
    async def _b_ok(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        n = int(arg or 5)
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, n, delay=0.001)
        c.w.write(chunk(finish="stop") + USAGE_CHUNK % n + DONE)

    _b_scripted = _b_ok  # the one model GET /models lists

    async def _b_echo(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """The last message's text back, as one chunk: an answer the test chose."""
        text = str(req["messages"][-1]["content"])
        c.w.write(SSE_HEAD + chunk(text) + chunk(finish="stop") + USAGE_CHUNK % 1 + DONE)

    async def _b_fast(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """N one-token chunks as fast as the socket takes them; `fastend-N`: the last token
        is `end<k>` for the k-th such request (a benchmark can tell answers apart)."""
        n = int(arg or 20000)
        self.fast_requests += 1
        last = f"end{self.fast_requests}" if req.get("model", "").startswith("fastend") else ""
        c.w.write(SSE_HEAD)
        for i in range(n):
            # Prose-like: a paragraph break every 60 tokens, as a model writes.
            token = last if last and i == n - 1 else f"t{i}"
            c.w.write(chunk(f"{token}\n\n" if i % 60 == 59 else f"{token} "))
            if i % 512 == 0:
                await c.w.drain()
        self.tokens_sent += n
        c.w.write(chunk(finish="stop") + USAGE_CHUNK % n + DONE)
        await c.w.drain()
        self.last_byte_ns = time.perf_counter_ns()  # for the UI-ingest benchmark

    _b_fastend = _b_fast

    async def _b_burst(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """`burst-N-MS`: after MS ms (50 by default), N tokens in one write, as a proxy
        that buffers the stream hands them on: no gap between them to time."""
        n, _, ms = arg.partition("-")
        c.w.write(SSE_HEAD)
        await c.w.drain()
        await asyncio.sleep(float(ms or 50) / 1000)
        body = b"".join(chunk("tok ") for _ in range(int(n)))
        c.w.write(body + chunk(finish="stop") + USAGE_CHUNK % int(n) + DONE)
        self.tokens_sent += int(n)

    async def _b_paced(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """`paced-N-R`: N prose tokens at R tokens a second (a local model's pace, with
        no model beside it: what the UI alone costs per second of an answer)."""
        n, _, rate = arg.partition("-")
        c.w.write(SSE_HEAD)
        start = time.perf_counter()
        for i in range(int(n)):
            c.w.write(chunk("word\n\n" if i % 60 == 59 else "word "))
            await c.w.drain()
            await asyncio.sleep(max(0.0, start + (i + 1) / float(rate) - time.perf_counter()))
        c.w.write(chunk(finish="stop") + USAGE_CHUNK % int(n) + DONE)

    async def _b_status(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """`status-429`: that status with an error object; 429 and 503 carry Retry-After
        (`status-429-date`: as an HTTP date 60 s ahead)."""
        code, _, form = arg.partition("-")
        status = int(code)
        extra = ""
        if status in (429, 503):
            when = formatdate(time.time() + 60, usegmt=True) if form == "date" else "7"
            extra = f"retry-after: {when}\r\n"
        body = json.dumps({"error": {"message": f"scripted {status}", "type": "x"}}).encode()
        c.w.write(http(status, body, extra=extra))

    async def _b_echokey(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """A careless server that quotes the caller's Authorization header in its error:
        as a 401 body, or (`echokey-stream`) as an error object mid-stream."""
        said = f"invalid credentials {c.headers.get('authorization', '')!s}"
        if arg == "stream":
            c.w.write(SSE_HEAD + chunk("partial "))
            c.w.write(b"data: " + json.dumps({"error": {"message": said}}).encode() + b"\n\n")
        else:
            c.w.write(http(401, json.dumps({"error": {"message": said}}).encode()))

    async def _b_json(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        body = {
            "choices": [
                {
                    "message": {"role": "assistant", "content": "whole answer"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        }
        c.w.write(http(200, json.dumps(body).encode()))

    async def _b_html(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        page = b"<html><head><title>Proxy login</title></head><body>sign in</body></html>"
        c.w.write(http(int(arg or 200), page, ctype="text/html"))

    async def _b_malformed(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        c.w.write(SSE_HEAD + chunk("ok ") + b"data: {not json\n\n" + DONE)

    async def _b_split(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        payload = SSE_HEAD + b"".join(chunk(t) for t in ["αβ", "γ ", "δ😀"])
        payload += b": keep-alive\n\n" + chunk(finish="stop") + DONE
        step = int(arg or 1)
        c.w.write(payload[: len(SSE_HEAD)])
        for i in range(len(SSE_HEAD), len(payload), step):
            c.w.write(payload[i : i + step])
            await c.w.drain()
            await asyncio.sleep(0.0005)  # so each piece leaves in its own TCP segment

    async def _b_keepalive(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        c.w.write(SSE_HEAD + b": ping\n\n" + chunk("a") + b":\n\n" + chunk("b"))
        c.w.write(chunk(finish="stop") + DONE)

    async def _b_nodone(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        c.w.write(SSE_HEAD + chunk("complete") + chunk(finish="stop"))

    async def _b_cut(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """Tokens, then the connection closes cleanly with no finish and no [DONE]."""
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, 3)

    async def _b_errormid(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """Text, then an error object; `errormid-markup`: one full of terminal control."""
        said = "crashed \x1b]0;pwned\x07 [bold]" if arg == "markup" else "model crashed"
        error = {"error": {"message": said, "type": "server_error"}}
        c.w.write(SSE_HEAD + chunk("par") + chunk("tial"))
        c.w.write(b"data: " + json.dumps(error).encode() + b"\n\n")

    async def _b_stall(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, 3)
        await c.w.drain()
        await c.idle(float(arg or 30))

    async def _b_pingstall(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """Tokens, then only keep-alive comments: alive, but the answer has stalled."""
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, 3)
        for _ in range(int(float(arg or 30) / 0.05)):
            c.w.write(b": ping\n\n")
            await c.w.drain()
            await asyncio.sleep(0.05)

    async def _b_trickle(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """A token, then one event dribbled a byte at a time over `arg` seconds: slow, but
        never silent, so not a stall."""
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, 1)
        event = chunk("slow but steady")
        for i in range(len(event)):
            c.w.write(event[i : i + 1])
            await c.w.drain()
            await asyncio.sleep(float(arg or 1) / len(event))
        c.w.write(chunk(finish="stop") + DONE)

    async def _b_slowstart(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """A long silent prefill, then a normal answer: not a stall."""
        c.w.write(SSE_HEAD)
        await c.w.drain()
        await c.idle(float(arg or 1))
        await self._tokens(c.w, 3, delay=0.001)
        c.w.write(chunk(finish="stop") + DONE)

    async def _b_lateheads(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """The response's headers only after `arg` seconds (a proxy, a queue), then a
        normal answer at once: the request's phases before its first token."""
        await c.idle(float(arg or 0.3))
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, 3, delay=0.001)
        c.w.write(chunk(finish="stop") + DONE)

    async def _b_nohead(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """Accepts the request and sends nothing at all, not even headers."""
        await c.idle(float(arg or 30))

    async def _b_reset(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        c.w.write(SSE_HEAD)
        await self._tokens(c.w, 3)
        await c.w.drain()
        sock = c.w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        c.w.transport.abort()

    async def _b_endless(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """Ignores max_tokens and never finishes: the client must stop it."""
        c.w.write(SSE_HEAD)
        for _ in range(1_000_000):
            c.w.write(chunk("more "))
            self.tokens_sent += 1
            await c.w.drain()
            await asyncio.sleep(0.0005)

    async def _b_huge(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        big = "x" * (int(arg or 10) * 1024 * 1024)
        c.w.write(SSE_HEAD + chunk(big) + chunk(finish="stop") + DONE)

    async def _b_markup(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        c.w.write(SSE_HEAD + b"".join(chunk(p) for p in MARKUP_PIECES))
        c.w.write(chunk(finish="stop") + DONE)


@contextlib.contextmanager
def fault_server_thread() -> Iterator[FaultServer]:
    """A `FaultServer` on its own event loop in a daemon thread, for a client that runs in
    another process (the `phasechat` command) or blocks the test's own loop."""
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    server = FaultServer()
    stop: asyncio.Future[None] | None = None

    async def serve() -> None:
        nonlocal stop
        stop = loop.create_future()
        async with server:
            ready.set()
            await stop

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the fault server did not start")
    try:
        yield server
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)
        loop.close()
