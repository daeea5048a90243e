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
