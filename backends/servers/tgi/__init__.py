"""Hugging Face's text-generation-inference (TGI; in maintenance mode: supported, not
built on). Its `/v1/models` names no owner of its own, so nothing is detected from the
listing; what it measured of a request it says in the headers of a reply it sends
whole (router/src/server.rs: `x-queue-time`, `x-inference-time`, `x-time-per-token`,
`x-total-time`, `x-validation-time`, in whole milliseconds, and `x-prompt-tokens`,
`x-generated-tokens`), read from any server that sends them."""

from __future__ import annotations

from collections.abc import Mapping

from phasechat.backends.events import ServerAccount
from phasechat.backends.servers.family import ServerFamily
from phasechat.backends.wire_numbers import Fields, as_count, as_ms


def _number(headers: Mapping[str, str], name: str, f: Fields, ms: bool) -> float | None:
    """Header `name` as whole milliseconds (`ms`) or a count; None when absent, or
    (noted) when it is not plain digits of a plausible value."""
    raw = headers.get(name)
    if raw is None:
        return None
    said = raw.strip()
    digits = said.isascii() and said.isdigit() and len(said) <= 12
    value = (as_ms(int(said)) if ms else as_count(int(said))) if digits else None
    if value is None:
        f.ignore(f"header {name}", raw)
    return value


def header_timing(headers: Mapping[str, str], f: Fields) -> ServerAccount | None:
    """The request's queue and whole time, and its counts, from TGI's headers. Its
    `x-total-time` (validation + queue + inference) ends when the reply is whole: the
    server's own time to the first byte of a reply sent whole."""
    queue = _number(headers, "x-queue-time", f, ms=True)
    total = _number(headers, "x-total-time", f, ms=True)
    inference = _number(headers, "x-inference-time", f, ms=True)
    if queue is None and total is None and inference is None:
        return None
    prompt = _number(headers, "x-prompt-tokens", f, ms=False)
    generated = _number(headers, "x-generated-tokens", f, ms=False)
    return ServerAccount(
        "TGI headers",
        prompt_tokens=int(prompt) if prompt is not None else None,
        generated_tokens=int(generated) if generated is not None else None,
        queue_ms=queue,
        ttft_ms=total,
    )


FAMILY = ServerFamily(
    name="TGI",
    header_timing=header_timing,
    docs="huggingface.co/docs/text-generation-inference; router/src/server.rs (headers)",
)
