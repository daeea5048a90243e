"""Every request's URL, built from a base URL the user gave.

A base URL may carry a query that every request must keep (Azure's
`.../openai/v1?api-version=2024-10-21`): a path is joined to the base's path, before
its query, never appended to the string (`...?api-version=X/chat/completions` asks
the wrong path with a query no server reads). A fragment is never sent.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


def endpoint(base: str, path: str) -> str:
    """`base` with `path` ("/chat/completions") joined to its path, its query kept."""
    scheme, netloc, base_path, query, _fragment = urlsplit(base)
    return urlunsplit((scheme, netloc, base_path.rstrip("/") + path, query, ""))


def trimmed(base: str) -> str:
    """`base` without a final "/" on its path (the query kept)."""
    return endpoint(base, "")


def root_of(base: str) -> str:
    """The server's root for its own endpoints (`/props`, `/tokenize`, `/metrics`): the
    base URL without a final /v1, its query kept."""
    scheme, netloc, path, query, _fragment = urlsplit(base)
    return urlunsplit((scheme, netloc, re.sub(r"/v1$", "", path.rstrip("/")), query, ""))


#: Names of this machine that reach the same server as 127.0.0.1.
_LOOPBACK = ("localhost", "127.0.0.1")


def server_key(base: str) -> str:
    """What two base URLs share when they reach the same server: the scheme and host in
    lower case (localhost as 127.0.0.1), the port (the scheme's default when none is
    written), the path without a final "/" or "/v1", and the query (Azure's
    `?api-version=` makes another deployment). No user, password or fragment."""
    parts = urlsplit(base.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    host = _LOOPBACK[1] if host in _LOOPBACK else host
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a port no request could go to: only the same text matches
        return base
    path = re.sub(r"/v1$", "", parts.path.rstrip("/")).rstrip("/")
    return urlunsplit((scheme, f"{host}:{port}", path, parts.query, ""))
