"""Debug logging of the remote backend's HTTP traffic, with secrets redacted.

Off unless the application turns the `phasechat.http` logger to DEBUG. Each request is
logged with its method, URL and headers, each response with its status and headers;
bodies are never logged (they hold the user's prompts). Credentials (Authorization,
API-key headers, cookies, a password in the URL, key-like query parameters) are replaced
by a redacted form before anything reaches a log record.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl, quote_plus, urlencode, urlsplit, urlunsplit

import httpx

logger = logging.getLogger("phasechat.http")

REDACTED = "…redacted"
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie", "set-cookie"}
)
_SECRET_PARAMS = frozenset({"key", "api_key", "apikey", "api-key", "token", "access_token"})


def redact_secret(secret: str) -> str:
    """A secret as it may be shown: a short known prefix at most (`sk-…redacted`)."""
    scheme, sep, value = secret.partition(" ")
    if sep and scheme.lower() in ("bearer", "basic", "token"):
        return f"{scheme} {redact_secret(value)}"
    # A prefix like "sk-" names the provider without revealing the key; short secrets
    # show nothing at all.
    prefix = secret[:3] if len(secret) >= 20 and secret[:3].isascii() else ""
    return prefix + REDACTED


def key_problem(key: str, env: str) -> str | None:
    """Why `key` (already stripped) cannot go in a header, in one line without it:
    a control or non-ASCII character would be refused by the HTTP library, whose error
    then quotes the whole header value."""
    for i, ch in enumerate(key):
        if not (" " <= ch <= "~"):
            what = "control" if ch.isascii() or not ch.isprintable() else "non-ASCII"
            return (
                f"the API key in ${env} has a {what} character at position {i + 1}:"
                " not sent (fix the variable)"
            )
    return None


#: The shortest start of a key that counts as a leak when a server cut its echo short.
MIN_LEAK = 8


def scrub_key(text: str, key: str) -> str:
    """`text` with `key` redacted, and also the longest start of `key` (at least
    MIN_LEAK characters) found in it: a server's echo cut short at any length."""
    if not key or len(key) < MIN_LEAK:
        return text.replace(key, redact_secret(key)) if key and key in text else text
    text = text.replace(key, redact_secret(key))
    for n in range(len(key) - 1, MIN_LEAK - 1, -1):
        if key[:n] in text:
            return text.replace(key[:n], redact_secret(key))
    return text


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` with every credential-bearing value redacted."""
    return {k: redact_secret(v) if k.lower() in _SECRET_HEADERS else v for k, v in headers.items()}


def redact_url(url: str) -> str:
    """`url` without a password in its userinfo or a key-like query parameter."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name = user.partition(":")[0]
        netloc = f"{name}:{REDACTED}@{host}" if ":" in user else f"{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, REDACTED if k.lower() in _SECRET_PARAMS else v) for k, v in pairs],
            quote_via=lambda v, *args: v if v == REDACTED else quote_plus(v, *args),
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_base_url(url: str) -> None:
    """Raise ValueError, in one line that shows no password, when `url` cannot be a
    server's base URL: a control character (a pasted `\\r`), a broken IPv6 bracket, a
    port beyond 65535."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("bad base URL: it holds a control character (a pasted newline?)")
    try:
        shown = redact_url(url)
        port = httpx.URL(url).port
    except (ValueError, httpx.InvalidURL) as exc:
        raise ValueError(f"bad base URL: {' '.join(str(exc).split())[:120]}") from None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"bad base URL {shown}: port {port} is not 1-65535")


async def log_request(request: httpx.Request) -> None:
    """httpx request hook: method, URL, redacted headers and body size."""
    if logger.isEnabledFor(logging.DEBUG):
        try:
            size = f"{len(request.content)} bytes"
        except httpx.RequestNotRead:
            size = "streamed"
        logger.debug(
            "-> %s %s headers=%s body=%s",
            request.method,
            redact_url(str(request.url)),
            redact_headers(dict(request.headers)),
            size,
        )


async def log_response(response: httpx.Response) -> None:
    """httpx response hook: status and redacted headers (before the body is read)."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "<- %s %s %d headers=%s",
            response.request.method,
            redact_url(str(response.request.url)),
            response.status_code,
            redact_headers(dict(response.headers)),
        )


def event_hooks() -> dict[str, list[Callable[..., Awaitable[None]]]]:
    """The hooks to pass to `httpx.AsyncClient(event_hooks=...)`."""
    return {"request": [log_request], "response": [log_response]}
