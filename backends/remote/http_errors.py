"""HTTP failures of the remote backend, each turned into one line a person can act on.

A status code, a server's error object, an HTML page from a proxy or a socket error all
become a `StreamError` whose `kind` says what went wrong and whose `retryable` says
whether trying again can help.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from phasechat.backends.events import StreamError
from phasechat.backends.remote.wire_numbers import NOT_JSON, as_retry_after, load_json

_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


def plural(n: int, word: str) -> str:
    """`3 chunks`, `1 chunk`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def error_text(obj: Any) -> str:
    """The human part of an OpenAI-style `{"error": ...}` object (or of anything else)."""
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)[:300]
    if isinstance(err, str):
        return err[:300]
    return str(obj)[:300]


def body_text(body: str) -> str:
    """A short, one-line summary of an error body: JSON error, HTML title, or text."""
    said = load_json(body)  # a body of 4,000 `[` is not JSON either
    if said is not NOT_JSON:
        return error_text(said)
    if "<html" in body[:512].lower() or "<!doctype" in body[:512].lower():
        # A proxy's or load balancer's error page: its title says more than its markup.
        title = _TITLE.search(body)
        body = title.group(1) if title else _TAG.sub(" ", body)
    return " ".join(body.split())[:200]


def status_error(
    status: int, body: str, base_url: str, key_env: str, retry_after: str | None = None
) -> StreamError:
    """One clear line for an HTTP error status, with the server's own message."""
    detail = body_text(body)
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
    wait = parse_retry_after(retry_after)
    when = f" (retry in {wait:g} s)" if wait is not None else ""
    if status == 429:
        return StreamError(
            "rate_limited",
            f"HTTP 429 rate limited by {base_url}{suffix}{when}",
            retryable=True,
            status=status,
            retry_after_s=wait,
        )
    if status >= 500:
        # 503 often carries Retry-After too (an overloaded or still-loading server).
        return StreamError(
            "server",
            f"HTTP {status} server error at {base_url}{suffix}{when}",
            retryable=True,
            status=status,
            retry_after_s=wait,
        )
    return StreamError("bad_request", f"HTTP {status} from {base_url}{suffix}", status=status)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date): None
    when it is neither, or not finite (`1e999`); never more than MAX_RETRY_AFTER_S."""
    if not value:
        return None
    try:
        return as_retry_after(float(value))
    except ValueError:
        from datetime import UTC, datetime
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return as_retry_after(round((when - datetime.now(UTC)).total_seconds()))


def causes(exc: BaseException) -> list[str]:
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


def connect_error(exc: httpx.HTTPError, base_url: str, wait_s: float) -> StreamError:
    """A failure before the response headers arrived (`wait_s`: the read timeout)."""
    if isinstance(exc, httpx.ReadTimeout):
        # Connected, but the server sent no headers within first_token_timeout_s.
        return StreamError("timeout", f"no answer from {base_url} within {wait_s:g} s", True)
    message = connect_message(exc, base_url)
    # A bad URL or a certificate that does not verify will fail the same way again.
    retryable = "TLS error" not in message and not message.startswith("not an http")
    return StreamError("connection", message, retryable=retryable)


def connect_message(exc: httpx.HTTPError, base_url: str) -> str:
    """Why a connection to `base_url` failed, in words (refused, unknown host, TLS...)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {base_url}: timed out"
    if isinstance(exc, httpx.ConnectError):
        low = " ".join(causes(exc)).lower()
        if "name or service" in low or "nodename" in low or "gaierror" in low:
            return f"cannot connect to {base_url}: unknown host"
        if "refused" in low or "errno 111" in low:
            return f"cannot connect to {base_url}: connection refused (is the server running?)"
        if "certificate" in low or "ssl" in low:
            return f"cannot connect to {base_url}: TLS error ({text[:120]})"
        return f"cannot connect to {base_url}: {text[:160]}"
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return f"not an http(s) URL: {base_url}"
    if isinstance(exc, httpx.LocalProtocolError):
        # Its text quotes the refused header value, which may be a credential.
        return f"request to {base_url} failed: a request header was refused by the HTTP library"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{base_url} closed the connection without an answer"
    return f"request to {base_url} failed: {type(exc).__name__}: {text[:160]}"


def lost_message(exc: httpx.HTTPError, chunks: int) -> str:
    """A connection that broke after the answer started."""
    low = " ".join(causes(exc)).lower()
    how = "reset by the server" if "reset" in low or "errno 104" in low else "lost"
    return f"connection {how} after {plural(chunks, 'chunk')} of the answer"
