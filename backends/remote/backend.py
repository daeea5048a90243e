"""The remote backend: any OpenAI-compatible `/chat/completions` endpoint, over httpx.

Works with every OpenAI-compatible server; what it does differently for each kind of
server (how it finds the window, what a request adds, which timing fields it reads) is
that server's family (backends/remote/servers/), found from its `/v1/models` listing.
The API key is read from an environment variable at request time and lives only in the
request headers: it is never logged, stored or shown, and a server that echoes it back
in an error message has it redacted before the message goes anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import httpx

from phasechat.backends.base import LoadState, RenderedPrompt, TokenCount
from phasechat.backends.events import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    Message,
    Notice,
    ReasoningDelta,
    ResponseStarted,
    ServerAccount,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.backends.remote.http_errors import connect_error, lost_message, plural, status_error
from phasechat.backends.remote.httplog import (
    check_base_url,
    event_hooks,
    key_problem,
    redact_url,
    scrub_key,
)
from phasechat.backends.remote.openai_wire import parse_chunk, whole_reply
from phasechat.backends.remote.server_metrics import MetricsWatch, joined, span_of
from phasechat.backends.remote.servers import (
    GENERIC,
    ask_window,
    context_refusal,
    header_account,
    identify,
)
from phasechat.backends.remote.servers.family import NativeChat
from phasechat.backends.remote.servers.forcing import Forcing, Server
from phasechat.backends.remote.sse import LineParser, SSEParser
from phasechat.backends.remote.urls import endpoint, root_of, trimmed
from phasechat.backends.remote.windows import DEADLINE_S as WINDOW_DEADLINE_S
from phasechat.backends.remote.windows import Window, read_body
from phasechat.backends.remote.wire_numbers import (
    MAX_TOKENS,
    NOT_JSON,
    Fields,
    load_json,
    prompt_bound,
)
from phasechat.backends.untrusted import as_text

TLS_OFF = "TLS certificate verification is off: the server's identity is not checked"


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """An endpoint profile. `model=None` takes the first model the server lists."""

    base_url: str = "http://127.0.0.1:8080/v1"
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    name: str = "openai"
    connect_timeout_s: float = 10.0
    first_token_timeout_s: float = 300.0  # a long prefill is not a stall
    stall_timeout_s: float = 15.0  # the longest gap allowed between events, mid-answer
    #: `GET /models` at start, headers and all (its body: the window look-up's deadline)
    listing_timeout_s: float = 10.0
    verify_tls: bool = True  # turning it off is explicit and announced on every answer
    #: the server's context window, for a server that does not say it (None: ask it)
    context_window: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse, in one line, a base URL no request could go to and an absurd window:
        every backend, dialog and log line after this may rely on both."""
        check_base_url(self.base_url)
        window = self.context_window
        if window is not None and not 0 <= window <= MAX_TOKENS:
            raise ValueError(f"context window {window:.3g} is not 0-{MAX_TOKENS:,} tokens")


class ConnectTimer:
    """How long a request spent opening its connection, from httpx's trace extension
    (httpcore's `connection.connect_tcp.*` and `connection.start_tls.*` events): 0 when
    it went out on a kept-alive connection; and when its body was all written
    (`http11.send_request_body.complete`, or HTTP/2's)."""

    def __init__(self) -> None:
        self.started: int | None = None
        self.ended: int | None = None
        self.body_sent: int | None = None

    async def trace(self, event: str, info: dict[str, object]) -> None:
        if event == "connection.connect_tcp.started" and self.started is None:
            self.started = time.perf_counter_ns()
        elif event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self.ended = time.perf_counter_ns()
        elif event.endswith(".send_request_body.complete"):
            self.body_sent = time.perf_counter_ns()

    def ms(self) -> float:
        if self.started is None or self.ended is None:
            return 0.0
        return (self.ended - self.started) / 1e6


class RemoteBackend:
    """A `Backend` over an OpenAI-compatible HTTP endpoint."""

    exact_token_counts = False
    serial = False  # a server may batch concurrent requests

    def __init__(
        self,
        config: RemoteConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        request_headers: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """`request_headers`: more headers for each chat request, asked for as it is
        built (a trace's `traceparent`); ours (the key among them) win over them."""
        self.config = config or RemoteConfig()
        self._transport = transport  # tests replay recorded streams through this
        self._request_headers = request_headers
        self.models: list[str] = []
        #: the HTTP status of the `/models` listing at `start` (None: no answer)
        self.listing_status: int | None = None
        #: what kind of server it is (from its /models listing at `start`)
        self.family = GENERIC
        self._model = self.config.model or ""
        self._state: LoadState = "idle"
        self._detail = self._with_tls("not connected")
        self._client: httpx.AsyncClient | None = None
        #: notices from `start` (numbers not believed, a slow listing), for the next answer
        self._pending: list[str] = []
        #: the context window and where it came from (None: unknown), and why it is
        #: unknown where the server's listing says (Dynamo's `context_window: 0`)
        self.window: Window | None = None
        self.window_unknown: str | None = None
        if self.config.context_window:
            self.window = Window(self.config.context_window, "set by the user")
        #: the server's /metrics, read before and after each request, where its family
        #: has a page (`PromNames.probe`: always, or where its window look-up said so)
        self.metrics = MetricsWatch()
        #: the server keeps a record of each request (`PromNames.record`), until one
        #: read finds none
        self._records = True

    @property
    def name(self) -> str:
        return self.config.name

    @cached_property
    def base_url(self) -> str:
        # worked out once: the config is frozen, and every event's parse names the URL
        return trimmed(self.config.base_url)

    @property
    def shares_cpu(self) -> bool:
        """A server on a loopback address runs on this machine (maybe on its GPU, which
        we cannot see: assumed to share the CPU)."""
        host = httpx.URL(self.config.base_url).host
        return host in ("localhost", "::1") or host.startswith("127.")

    @cached_property
    def shown_url(self) -> str:
        """The base URL as it may be shown or logged (no password, no key parameter)."""
        return redact_url(self.base_url)

    @property
    def model(self) -> str:
        return self._model or "(server default)"

    @property
    def state(self) -> LoadState:
        return self._state

    @property
    def state_detail(self) -> str:
        return self._detail

    def _with_tls(self, detail: str) -> str:
        return detail if self.config.verify_tls else f"{detail} · TLS verification off"

    def _raw_key(self) -> str:
        return os.environ.get(self.config.api_key_env, "")

    def _key(self) -> str:
        # A key pasted with its newline: the whitespace around it is never part of a key.
        return self._raw_key().strip()

    def key_problem(self) -> str | None:
        """Why the API key cannot be sent, in one line that never contains it."""
        return key_problem(self._key(), self.config.api_key_env)

    def key_notice(self) -> str | None:
        """A notice when whitespace around the key was removed."""
        raw = self._raw_key()
        if raw and raw != raw.strip():
            return f"removed whitespace around the API key in ${self.config.api_key_env}"
        return None

    def _headers(self) -> dict[str, str]:
        key = self._key()
        headers = {"Accept": "text/event-stream"}
        if key and self.key_problem() is None:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _plain_headers(self) -> dict[str, str]:
        """The headers of a request that is not a stream (the key, where there is one)."""
        return {k: v for k, v in self._headers().items() if k != "Accept"}

    def _scrub(self, text: str) -> str:
        """`text` with the API key redacted: some servers echo it in their errors, whole
        or cut short, so a long enough piece of the key's start is redacted too."""
        return scrub_key(text, self._key())

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            c = self.config
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(c.first_token_timeout_s, connect=c.connect_timeout_s),
                verify=c.verify_tls,
                transport=self._transport,
                event_hooks=event_hooks(),
            )
        return self._client

    async def start(self) -> None:
        """Ask `GET /models` which models exist; pick one if none was configured."""
        self._state, self._detail = "loading", f"connecting to {self.shown_url}"
        problem = self.key_problem()
        if problem is not None:
            self._state, self._detail = "failed", problem
            return
        listing: object = NOT_JSON
        wait = self.config.listing_timeout_s
        try:
            # One deadline for the headers: a server that drips them a byte at a time
            # must not hold the start for a timeout per read.
            async with (
                asyncio.timeout(wait),
                self._http().stream(
                    "GET", endpoint(self.base_url, "/models"), headers=self._headers(), timeout=wait
                ) as r,
            ):
                self.listing_status = r.status_code
                if r.status_code != 200:
                    raw = await _prefix(r, 64 * 1024)
                    # Scrubbed before anything cuts it short: a cut key would not match.
                    body = self._scrub(raw.decode("utf-8", errors="replace"))
                    key_env = self.config.api_key_env
                    err = status_error(r.status_code, body, self.shown_url, key_env)
                    self._state, self._detail = "failed", self._scrub(err.message)
                    return
                listing = await self._listing(r)
        except TimeoutError:
            self._state, self._detail = (
                "failed",
                f"no answer from {self.shown_url} within {wait:g} s",
            )
            return
        except httpx.HTTPError as exc:
            err = connect_error(exc, self.shown_url, wait)
            self._state, self._detail = "failed", self._scrub(err.message)
            return
        data = listing.get("data") if isinstance(listing, dict) else None
        entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        self.models = [as_text(m["id"]) for m in entries if isinstance(m.get("id"), str)]
        self.family = await identify(self._http(), self.base_url, self._plain_headers(), entries)
        if not self._model and self.models:
            self._model = self.models[0]
        if self.window is None:
            f = Fields()
            self.window = await ask_window(
                self._http(), self.base_url, self._headers(), entries, self._model, self.family, f
            )
            if (line := f.notice(self.shown_url)) is not None:
                self._pending.append(line)
            unknown = self.family.unknown_window
            if self.window is None and unknown is not None:
                entry = next((e for e in entries if e.get("id") == self._model), {})
                self.window_unknown = unknown(entry)
        page = self.family.metrics
        said = self.window is not None and self.window.metrics
        if page is not None and (page.probe == "always" or said):
            root, headers = root_of(self.base_url), self._plain_headers()
            await self.metrics.start(self._http(), root, headers, page.path, page)
            if not self.metrics.enabled and page.absent:  # said once, on the next answer
                self._pending.append(f"{self.shown_url}{page.path}: {page.absent}")
        self._state, self._detail = "ready", self._with_tls(f"{self.shown_url} · {self.model}")

    async def _listing(self, r: httpx.Response) -> object:
        """The `/models` listing's JSON, read within the window look-up's deadline: a
        server that drips it leaves the model list and the window unknown."""
        try:
            async with asyncio.timeout(WINDOW_DEADLINE_S):
                body = await read_body(r)
        except TimeoutError:
            body = None
            self._pending.append(
                f"{endpoint(self.shown_url, '/models')} took over {WINDOW_DEADLINE_S:g} s: "
                "its model list and context window are unknown"
            )
        return load_json(body) if body is not None else NOT_JSON

    @property
    def context_window(self) -> int | None:
        return self.window.tokens if self.window is not None else None

    @property
    def context_source(self) -> str | None:
        """Where the window comes from; without one, why it is unknown where the server
        says (None: it says nothing)."""
        return self.window.source if self.window is not None else self.window_unknown

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        from phasechat.backends.tokens import estimate_messages

        return TokenCount(estimate_messages(messages), estimated=True)

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        return None  # a server does not say what it holds before a request

    async def warm(self, messages: tuple[Message, ...]) -> int:
        return 0  # no portable way to prefill a server's cache without generating

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        """The prompt as the server reads it, where its family can say (llama-server
        and vLLM render and tokenize exactly); None where it cannot."""
        render = self.family.render
        if render is None or self._state != "ready":
            return None
        return await render(self._http(), root_of(self.base_url), self._plain_headers(), messages)

    def teacher(self) -> tuple[Forcing, Server] | None:
        """How this server reads a given token sequence, teacher-forced (its family's
        `Forcing`), and where it is; None: its family cannot, or it is not ready."""
        forcing = self.family.forcing
        if forcing is None or self._state != "ready":
            return None
        server = Server(
            self._http(), self.base_url, self._plain_headers(), self._model, self._scrub
        )
        return forcing, server

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body of a streamed chat completion (of its family's own chat
        endpoint where it has one: `ServerFamily.native`)."""
        native = self.family.native
        if native is not None:
            return {**native.body(request, self._model), **self.config.extra_body}
        body: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if self._model:
            body["model"] = self._model
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        body.update(self.family.request_extras)  # only its family accepts them
        body.update(self.config.extra_body)
        return body

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        """Stream one answer; closing the iterator closes the HTTP response."""
        if not self.config.verify_tls:
            yield Notice(TLS_OFF)
        for line in self._pending:
            yield Notice(self._scrub(line), doubt=True)
        self._pending.clear()
        notice = self.key_notice()
        if notice is not None:
            yield Notice(notice)
        problem = self.key_problem()
        if problem is not None:
            yield StreamError("auth", problem)
            return
        async for event in self._send(request):
            if isinstance(event, StreamError):
                event = dataclasses.replace(event, message=self._scrub(event.message))
            elif isinstance(event, Notice):
                event = dataclasses.replace(event, text=self._scrub(event.text))
            yield event

    async def _send(self, request: GenerationRequest) -> AsyncIterator[Event]:
        client = self._http()
        connect = ConnectTimer()
        sent = time.perf_counter_ns()  # the server's account of the request fits after it
        extra = self._request_headers() if self._request_headers is not None else {}
        native = self.family.native
        url = (
            endpoint(self.base_url, "/chat/completions")
            if native is None
            else endpoint(root_of(self.base_url), native.path)
        )
        try:
            req = client.build_request(
                "POST",
                url,
                json=self.request_body(request),
                headers={**extra, **self._headers()},
                extensions={"trace": connect.trace},
            )
            try:
                response = await client.send(req, stream=True)
            except httpx.RemoteProtocolError:
                # A kept-alive connection the server had already closed (llama-server
                # does this after some streamed answers): nothing was answered, so the
                # request goes once more, on a new connection.
                response = await client.send(req, stream=True)
        except httpx.HTTPError as exc:
            yield connect_error(exc, self.shown_url, self.config.first_token_timeout_s)
            return
        ticket = self.metrics.begin()  # from the response's headers to its end
        try:
            if response.status_code != 200:
                raw = (await response.aread())[:4000].decode("utf-8", errors="replace")
                error = status_error(
                    response.status_code,
                    self._scrub(raw),
                    self.shown_url,
                    self.config.api_key_env,
                    response.headers.get("retry-after"),
                )
                refusal = context_refusal(raw) if response.status_code == 400 else None
                if refusal is not None:  # the prompt does not fit the server's window
                    error = dataclasses.replace(error, kind="context_overflow", detail=refusal)
                yield error
                return
            yield ResponseStarted(response.status_code, connect.ms(), connect.body_sent)
            # the server's own account of this request, from its headers or the stream
            # (its family's fields), said once the answer is over, beside its /metrics'
            own, said_wrong = self._header_account(response.headers)
            if said_wrong is not None:
                yield Notice(said_wrong, doubt=True)
            ctype = response.headers.get("content-type", "")
            if "text/event-stream" in ctype:
                events = self._sse(response, request)
            elif native is not None and "ndjson" in ctype:
                events = self._sse(response, request, native)
            else:
                events = whole_reply(response, ctype, self.shown_url)
            usage: Usage | None = None
            most = prompt_bound(request.messages)
            doubted: set[str] = set()  # llama-server sends timings with every token
            async for event in events:
                if isinstance(event, Usage | ServerTimings):
                    event, doubt = _within_prompt(event, most, self.shown_url)
                    if doubt is not None and doubt not in doubted:
                        doubted.add(doubt)
                        yield Notice(doubt, doubt=True)
                if isinstance(event, Usage):
                    usage = event
                elif isinstance(event, ServerAccount):
                    own = event
                    continue
                elif isinstance(event, Finished) and (self.metrics.enabled or own is not None):
                    # The answer is over: its end is now, before the server is asked
                    # for its own account of it.
                    ended = time.perf_counter_ns()
                    root, headers = root_of(self.base_url), self._plain_headers()
                    watch = self.metrics
                    e2e_ms = (ended - sent) / 1e6
                    span = span_of(e2e_ms, request.messages, request.max_tokens, usage)
                    scraped = (
                        await watch.finished(ticket, client, root, headers, usage, span)
                        if watch.enabled
                        else None
                    )
                    page = self.family.metrics
                    if own is None and watch.enabled and page and page.record and self._records:
                        f = Fields()
                        own = await page.record(client, root, headers, f)
                        self._records = own is not None  # none kept: not asked again
                        if (line := f.notice(self.shown_url)) is not None:
                            yield Notice(line, doubt=True)
                    account = joined(own, scraped, span)
                    if account is not None:
                        yield account
                        for line in account.doubts:
                            yield Notice(line, doubt=True)
                    event = dataclasses.replace(event, t_ns=ended)
                elif isinstance(event, StreamError):
                    self.metrics.last = None  # it ran: no clean "before" for the next
                yield event
        finally:
            self.metrics.end()
            await response.aclose()

    def _header_account(self, headers: httpx.Headers) -> tuple[ServerAccount | None, str | None]:
        """The server's own account of the request from the response's headers (None:
        it has none), and the line naming the headers not believed (None: all were)."""
        f = Fields()
        return header_account(headers, f), f.notice(self.shown_url)

    def _events_of(self, data: str, native: NativeChat | None) -> list[Event]:
        """The events of one payload: an SSE event's data, or a line of `native`'s
        stream (with the notice naming what was not believed)."""
        if native is None:
            return parse_chunk(data, self.shown_url, self.family)
        f = Fields()
        out = native.parse(data, f)
        line = f.notice(self.shown_url)
        return out if line is None else [*out, Notice(line, doubt=True)]

    async def _sse(
        self, response: httpx.Response, request: GenerationRequest, native: NativeChat | None = None
    ) -> AsyncIterator[Event]:
        """The events of a streamed answer, with the first-token and stall deadlines
        (SSE, or `native`'s stream of JSON lines).

        Only the socket read is under a deadline, never a `yield`: time the consumer
        spends on an event is not the server's, and a timeout must not fire in the
        consumer's code. Once a token has arrived (answer or thinking: a model that thinks
        for minutes is making progress), any new event bytes (even a slow 10 MB event,
        read by read) move the stall deadline; keep-alive comments do not: a server that
        pings but says nothing has stalled all the same.
        """
        cfg = self.config
        parser: SSEParser | LineParser = SSEParser() if native is None else LineParser()
        chunks = 0
        finish: FinishReason | None = None
        silent: int | None = None  # when a finish reason came without text
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.first_token_timeout_s
        # Closed here, not left to the garbage collector, which would close it in a
        # task of its own after the request is over. (httpx types it as an iterator; it
        # is an async generator.)
        raw_reads = cast(AsyncGenerator[bytes, None], response.aiter_raw())
        said: set[str] = set()  # a server that sends NaN in every event is told once
        async with contextlib.aclosing(raw_reads) as reads:
            seen = 0  # parser.payload_bytes when the stall deadline last moved
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        raw = await anext(reads, None)
                    if raw is None:
                        break
                    t_read = time.perf_counter_ns()
                    batch = parser.feed(raw)
                except TimeoutError:
                    if chunks:
                        msg = (
                            f"stalled after {plural(chunks, 'chunk')} of the answer: "
                            f"nothing new for {cfg.stall_timeout_s:g} s"
                        )
                        yield StreamError("stalled", msg, retryable=True)
                    else:
                        wait = cfg.first_token_timeout_s
                        yield StreamError("timeout", f"no token within {wait:g} s", True)
                    return
                except httpx.HTTPError as exc:
                    yield StreamError("connection", lost_message(exc, chunks), retryable=True)
                    return
                except ValueError as exc:  # an SSE line beyond the parser's limit
                    yield StreamError("protocol", str(exc))
                    return
                for sse in batch:
                    if sse.data == "[DONE]":
                        yield Finished(finish or "stop", silent)
                        return
                    events = _once(self._events_of(sse.data, native), said)
                    text = any(isinstance(e, TextDelta | ReasoningDelta) for e in events)
                    if chunks and not text and Finished("stop") in events:
                        silent = t_read  # see Finished.t_silent_ns (a length has none)
                    if text:
                        chunks += 1
                        # Every chunk with text (answer or thinking) holds at least one
                        # token, so this never cuts a server that honours max_tokens.
                        if chunks > request.max_tokens:
                            n = request.max_tokens
                            yield Notice(f"the server ignored max_tokens ({n}); stopped here")
                            yield Finished("length")
                            return
                    for event in events:
                        if isinstance(event, StreamError):
                            yield event
                            return
                        if isinstance(event, Finished):
                            finish = event.reason
                            continue
                        if isinstance(event, TextDelta | ReasoningDelta):
                            # stamped where its bytes were read: how fast this stream's
                            # reader takes each event (a UI, a lock-step reader) moves
                            # no token's time (built anew: `dataclasses.replace` costs
                            # 2.4x as much, per token)
                            event = type(event)(event.text, event.tokens, t_read)
                        yield event
                if chunks and parser.payload_bytes > seen:
                    deadline = loop.time() + cfg.stall_timeout_s
                seen = parser.payload_bytes
        for sse in parser.close():
            if sse.data != "[DONE]":
                for event in _once(self._events_of(sse.data, native), said):
                    if isinstance(event, Finished):
                        finish = event.reason
                    elif isinstance(
                        event,
                        TextDelta | ReasoningDelta | Usage | ServerTimings | ServerAccount | Notice,
                    ):
                        yield event
        if finish is not None:
            yield Finished(finish, silent)
        else:
            msg = f"stream ended early after {plural(chunks, 'chunk')}, with no finish reason"
            yield StreamError("connection", msg, retryable=True)


async def _prefix(response: httpx.Response, size: int) -> bytes:
    """The first `size` bytes (or so) of a streamed `response`'s body."""
    data = bytearray()
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) >= size:
            break
    return bytes(data)


def _once(events: list[Event], said: set[str]) -> list[Event]:
    """`events` without the notices already in `said` (which gains the new ones)."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, Notice):
            if event.text in said:
                continue
            said.add(event.text)
        out.append(event)
    return out


def _within_prompt(
    event: Usage | ServerTimings, most: int, server: str
) -> tuple[Usage | ServerTimings, str | None]:
    """`event` without prompt counts past `most`, the most tokens the prompt sent can be
    (`prompt_bound`), and the line that says so (None: nothing was past it)."""
    if isinstance(event, Usage):
        said, name = event.prompt_tokens, "usage.prompt_tokens"
        cut: Usage | ServerTimings = dataclasses.replace(
            event, prompt_tokens=None, cached_tokens=None
        )
    else:
        said = (event.prompt_n or 0) + (event.cache_n or 0)
        name = "timings.prompt_n + cache_n"
        cut = dataclasses.replace(event, prompt_n=None, cache_n=None)
    if said is None or said <= most:
        return event, None
    return cut, (
        f"ignored {name} ({said:,}) from {server}: more than the prompt sent can be "
        f"(at most {most:,} tokens)"
    )
