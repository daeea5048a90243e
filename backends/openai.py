"""The remote backend: any OpenAI-compatible `/chat/completions` endpoint, over httpx.

Works with llama.cpp's llama-server (usage, `timings`, prefill progress), vLLM and
Ollama (usage only), llama-cpp-python's server (neither), LM Studio and OpenAI.
The API key is read from an environment variable at request time and lives only in the
request headers: it is never logged, stored or shown.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from backends.base import LoadState, TokenCount
from backends.events import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    Message,
    Notice,
    PrefillProgress,
    ResponseStarted,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from backends.sse import SSEParser

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop"}


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """An endpoint profile. `model=None` takes the first model the server lists."""

    base_url: str = "http://127.0.0.1:8080/v1"
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    name: str = "openai"
    connect_timeout_s: float = 10.0
    first_token_timeout_s: float = 300.0  # a long prefill is not a stall
    stall_timeout_s: float = 15.0  # the longest gap allowed between chunks
    verify_tls: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


class RemoteBackend:
    """A `Backend` over an OpenAI-compatible HTTP endpoint."""

    kind = "openai"
    supports_kv_stats = False
    exact_token_counts = False

    def __init__(
        self,
        config: RemoteConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config or RemoteConfig()
        self._transport = transport  # tests replay recorded streams through this
        self.models: list[str] = []
        self.is_llama_server = False
        self._model = self.config.model or ""
        self._state: LoadState = "idle"
        self._detail = "not connected"
        self._client: httpx.AsyncClient | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def base_url(self) -> str:
        return self.config.base_url.rstrip("/")

    @property
    def model(self) -> str:
        return self._model or "(server default)"

    @property
    def state(self) -> LoadState:
        return self._state

    @property
    def state_detail(self) -> str:
        return self._detail

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.config.api_key_env, "")
        headers = {"Accept": "text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            c = self.config
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(c.first_token_timeout_s, connect=c.connect_timeout_s),
                verify=c.verify_tls,
                transport=self._transport,
            )
        return self._client

    async def start(self) -> None:
        """Ask `GET /models` which models exist; pick one if none was configured."""
        self._state, self._detail = "loading", f"connecting to {self.base_url}"
        try:
            r = await self._http().get(
                f"{self.base_url}/models", headers=self._headers(), timeout=10.0
            )
        except httpx.HTTPError as exc:
            self._state, self._detail = "failed", _connect_message(exc, self.base_url)
            return
        if r.status_code != 200:
            err = _status_error(r.status_code, r.text, self.base_url, self.config.api_key_env)
            self._state, self._detail = "failed", err.message
            return
        try:
            body = r.json()
            self.models = [str(m["id"]) for m in body.get("data", [])]
            self.is_llama_server = any(
                m.get("owned_by") == "llamacpp" for m in body.get("data", [])
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            self.models = []
        if not self._model and self.models:
            self._model = self.models[0]
        self._state, self._detail = "ready", f"{self.base_url} · {self.model}"

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        from telemetry.tokens import estimate_messages

        return TokenCount(estimate_messages(messages), estimated=True)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body of a streamed chat completion."""
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
        if self.is_llama_server:
            body["return_progress"] = True  # llama-server only; OpenAI rejects unknown fields
        body.update(self.config.extra_body)
        return body

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Stream one answer; closing the iterator closes the HTTP response."""
        url = f"{self.base_url}/chat/completions"
        client = self._http()
        try:
            req = client.build_request(
                "POST", url, json=self.request_body(request), headers=self._headers()
            )
            response = await client.send(req, stream=True)
        except httpx.HTTPError as exc:
            yield StreamError("connection", _connect_message(exc, self.base_url), retryable=True)
            return
        try:
            async for event in self._events(response, request):
                yield event
        finally:
            await response.aclose()

    async def _events(
        self, response: httpx.Response, request: GenerationRequest
    ) -> AsyncIterator[Event]:
        if response.status_code != 200:
            text = (await response.aread())[:4000].decode("utf-8", errors="replace")
            yield _status_error(
                response.status_code,
                text,
                self.base_url,
                self.config.api_key_env,
                response.headers.get("retry-after"),
            )
            return
        yield ResponseStarted(response.status_code)
        ctype = response.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            async for event in _whole_reply(response, ctype):
                yield event
            return
        parser = SSEParser()
        chunks = 0
        finish: FinishReason | None = None
        loop = asyncio.get_running_loop()
        stall = self.config.stall_timeout_s
        try:
            async with asyncio.timeout(self.config.first_token_timeout_s) as deadline:
                async for raw in response.aiter_raw():
                    for sse in parser.feed(raw):
                        if sse.data == "[DONE]":
                            yield Finished(finish or "stop")
                            return
                        for event in _parse_chunk(sse.data):
                            if isinstance(event, StreamError):
                                yield event
                                return
                            if isinstance(event, Finished):
                                finish = event.reason
                                continue
                            if isinstance(event, TextDelta):
                                chunks += 1
                                # Every chunk with text holds at least one token.
                                if chunks > request.max_tokens:
                                    yield Notice("the server ignored max_tokens; stopped here")
                                    yield Finished("length")
                                    return
                            yield event
                    if chunks:
                        deadline.reschedule(loop.time() + stall)
                for sse in parser.close():
                    if sse.data != "[DONE]":
                        for event in _parse_chunk(sse.data):
                            if not isinstance(event, Finished | StreamError):
                                yield event
        except TimeoutError:
            if chunks:
                msg = f"stalled after {chunks} chunks: nothing for {stall:g} s"
                yield StreamError("stalled", msg, retryable=True)
            else:
                wait = self.config.first_token_timeout_s
                yield StreamError("timeout", f"no answer within {wait:g} s", retryable=True)
            return
        except httpx.HTTPError as exc:
            yield StreamError(
                "connection",
                f"connection lost after {chunks} chunks ({type(exc).__name__})",
                retryable=True,
            )
            return
        except ValueError as exc:  # an SSE line beyond the parser's limit
            yield StreamError("protocol", str(exc))
            return
        if finish is not None:
            yield Finished(finish)
        else:
            yield StreamError(
                "connection", f"stream ended early after {chunks} chunks", retryable=True
            )


def _parse_chunk(data: str) -> list[Event]:
    """Events in one `data:` payload of a chat-completion stream."""
    try:
        obj = json.loads(data)
    except ValueError:
        return [StreamError("protocol", f"malformed event from server: {data[:80]!r}")]
    if not isinstance(obj, dict):
        return [StreamError("protocol", f"unexpected event from server: {data[:80]!r}")]
    if "error" in obj:
        return [StreamError("server", f"server error: {_error_text(obj)}")]
    out: list[Event] = []
    progress = obj.get("prompt_progress")
    if isinstance(progress, dict):
        out.append(
            PrefillProgress(
                int(progress.get("total", 0)),
                int(progress.get("cache", 0)),
                int(progress.get("processed", 0)),
                float(progress.get("time_ms", 0.0)),
            )
        )
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if content:
            out.append(TextDelta(str(content)))
        reason = choice.get("finish_reason")
        if reason:
            out.append(Finished(_FINISH.get(str(reason), "other")))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        out.append(
            Usage(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                int(cached) if cached is not None else None,
            )
        )
    timings = obj.get("timings")
    if isinstance(timings, dict) and "prompt_n" in timings:
        out.append(
            ServerTimings(
                int(timings.get("prompt_n", 0)),
                float(timings.get("prompt_ms", 0.0)),
                int(timings.get("predicted_n", 0)),
                float(timings.get("predicted_ms", 0.0)),
                int(timings["cache_n"]) if "cache_n" in timings else None,
            )
        )
    return out


async def _whole_reply(response: httpx.Response, ctype: str) -> AsyncIterator[Event]:
    """A server that ignored `stream: true`: keep its answer, and say so."""
    body = (await response.aread())[: 64 * 1024 * 1024]
    try:
        obj = json.loads(body)
        message = obj["choices"][0]["message"]
        text = str(message.get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        kind = ctype.split(";")[0] or "no content type"
        yield StreamError("protocol", f"server did not stream (sent {kind}, not text/event-stream)")
        return
    yield Notice("the server does not stream: the answer arrived whole, so TTFT = e2e")
    yield TextDelta(text)
    for event in _parse_chunk(json.dumps({"usage": obj.get("usage")})):
        yield event
    reason = obj["choices"][0].get("finish_reason") or "stop"
    yield Finished(_FINISH.get(str(reason), "other"))


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)[:300]
    if isinstance(err, str):
        return err[:300]
    return str(obj)[:300]


def _status_error(
    status: int, body: str, base_url: str, key_env: str, retry_after: str | None = None
) -> StreamError:
    """One clear line for an HTTP error status, with the server's own message."""
    try:
        detail = _error_text(json.loads(body))
    except ValueError:
        detail = " ".join(body.split())[:200]
    suffix = f": {detail}" if detail else ""
    if status in (401, 403):
        hint = f"check the API key in ${key_env}" if status == 401 else "the key lacks access"
        return StreamError("auth", f"HTTP {status} from {base_url} ({hint}){suffix}", status=status)
    if status == 404:
        return StreamError(
            "not_found",
            f"HTTP 404 from {base_url}: wrong base URL (most end in /v1) or model{suffix}",
            status=status,
        )
    if status == 429:
        wait = _retry_after(retry_after)
        when = f"; retry in {wait:g} s" if wait is not None else ""
        return StreamError(
            "rate_limited",
            f"HTTP 429 rate limited by {base_url}{when}{suffix}",
            retryable=True,
            status=status,
            retry_after_s=wait,
        )
    if status >= 500:
        return StreamError(
            "server", f"HTTP {status} server error at {base_url}{suffix}", True, status
        )
    return StreamError("bad_request", f"HTTP {status} from {base_url}{suffix}", status=status)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from datetime import UTC, datetime
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _causes(exc: BaseException) -> list[str]:
    """The messages of an exception and of everything that caused it (anyio hides
    "connection refused" behind "All connection attempts failed")."""
    out: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 8:
        out.append(f"{type(seen).__name__}: {seen}")
        if isinstance(seen, BaseExceptionGroup):
            out += [f"{type(e).__name__}: {e}" for e in seen.exceptions]
        seen = seen.__cause__ or seen.__context__
    return out


def _connect_message(exc: httpx.HTTPError, base_url: str) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {base_url}: timed out"
    if isinstance(exc, httpx.ConnectError):
        low = " ".join(_causes(exc)).lower()
        if "name or service" in low or "nodename" in low or "gaierror" in low:
            return f"cannot connect to {base_url}: unknown host"
        if "refused" in low or "errno 111" in low:
            return f"cannot connect to {base_url}: connection refused"
        if "certificate" in low or "ssl" in low:
            return f"cannot connect to {base_url}: TLS error ({text[:120]})"
        return f"cannot connect to {base_url}: {text[:160]}"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return f"not an http(s) URL: {base_url}"
    return f"request to {base_url} failed: {type(exc).__name__}: {text[:160]}"
