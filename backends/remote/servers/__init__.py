"""The server families phasechat knows (`FAMILIES`, one package each), and the reads that
go through the table: which family a server is, its window, its refusals, and the
fields on a stream or its headers that say what they are whatever the listing claimed.

Adding a family is one package beside these, defining a `ServerFamily`
(backends/remote/servers/family.py) in its `__init__.py`, and its line in `FAMILIES`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from phasechat.backends.events import PrefillProgress, ServerAccount, ServerTimings, Usage
from phasechat.backends.remote.servers import (
    dynamo,
    llama_server,
    ollama,
    openai,
    sglang,
    tensorrt_llm,
    tgi,
    vllm,
)
from phasechat.backends.remote.servers.family import ServerFamily
from phasechat.backends.remote.urls import root_of
from phasechat.backends.remote.windows import DEADLINE_S, Window
from phasechat.backends.remote.wire_numbers import Fields, load_json

#: Every family, in the order they are tried: for a refusal's text the first that
#: recognises it says what it means.
FAMILIES: tuple[ServerFamily, ...] = (
    llama_server.FAMILY,
    vllm.FAMILY,
    ollama.FAMILY,
    openai.FAMILY,
    sglang.FAMILY,
    tgi.FAMILY,
    tensorrt_llm.FAMILY,
    dynamo.FAMILY,
)
#: A server no family claims: the OpenAI wire format and nothing more.
GENERIC = openai.FAMILY
#: The longest the families' own endpoints are asked which server it is (each answers
#: at once where it is served, a 404 where it is not).
IDENTIFY_S = 2.0


def detect(entries: list[dict[str, Any]]) -> ServerFamily:
    """The family whose `owned_by` the `/v1/models` `entries` carry, else `GENERIC`."""
    return _claimed(entries) or GENERIC


def _claimed(entries: list[dict[str, Any]]) -> ServerFamily | None:
    """The family whose `owned_by` the entries carry (the hosted OpenAI's too), else None."""
    owners = {e.get("owned_by") for e in entries}
    return next((fam for fam in FAMILIES if owners.intersection(fam.owned_by)), None)


async def identify(
    client: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    entries: list[dict[str, Any]],
) -> ServerFamily:
    """The server's family: by the `owned_by` of its listing (`detect`), else by what only
    one family's server answers (TGI's `/info`, Ollama's `/api/version`), asked of each
    such family at once and within IDENTIFY_S all together; else `GENERIC`."""
    listed = _claimed(entries)
    asking = [fam for fam in FAMILIES if fam.identify is not None]
    if listed is not None or not asking:
        return listed or GENERIC
    root = root_of(base_url)

    async def ask(fam: ServerFamily) -> bool:
        assert fam.identify is not None
        try:
            return await fam.identify(client, root, headers)
        except httpx.HTTPError:
            return False

    try:
        async with asyncio.timeout(IDENTIFY_S):
            said = await asyncio.gather(*(ask(fam) for fam in asking))
    except TimeoutError:
        return GENERIC
    return next((fam for fam, yes in zip(asking, said, strict=True) if yes), GENERIC)


def by_name(name: str) -> ServerFamily | None:
    """The family called `name` (as `ServerFamily.name` spells it), else None."""
    return next((fam for fam in FAMILIES if fam.name == name), None)


def from_models(
    entries: list[dict[str, Any]],
    model: str,
    f: Fields | None = None,
    family: ServerFamily | None = None,
) -> Window | None:
    """The window the `/v1/models` listing gives for `model`, from whichever family's
    field it carries (a proxy in front of a server passes the field through): `family`'s
    own first, so that a field two families share (`max_model_len`: vLLM and SGLang) is
    named for the server it came from."""
    entry = next((e for e in entries if e.get("id") == model), entries[0] if entries else {})
    order: tuple[ServerFamily, ...] = FAMILIES if family is None else (family, *FAMILIES)
    for fam in order:
        if fam.listed_window is not None and (found := fam.listed_window(entry, f)):
            return found
    return None


async def ask_window(
    client: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    entries: list[dict[str, Any]],
    model: str,
    family: ServerFamily,
    f: Fields | None = None,
) -> Window | None:
    """The window of `model` where the server says it: its `/v1/models` `entries` and
    `family`'s own endpoint, in the family's order; None when it does not say, says
    nonsense (noted in `f`) or takes longer than DEADLINE_S to say it."""
    root = root_of(base_url)
    own = family.own_window
    try:
        async with asyncio.timeout(DEADLINE_S):
            if own is not None and family.own_window_first:
                found = await own(client, root, headers, model, f)
                return found or from_models(entries, model, f, family)
            listed = from_models(entries, model, f, family)
            if listed is not None or own is None:
                return listed
            return await own(client, root, headers, model, f)
    except (TimeoutError, httpx.HTTPError):
        return None


def header_account(headers: Mapping[str, str], f: Fields) -> ServerAccount | None:
    """A server's own account of a request from its response's headers, by the first
    family whose headers they carry: header names say what they are whatever the
    listing claimed (TGI's listing names no owner)."""
    for family in FAMILIES:
        if family.header_timing is None:
            continue
        if family.timing_headers and not any(name in headers for name in family.timing_headers):
            continue
        if said := family.header_timing(headers, f):
            return said
    return None


def chunk_progress(chunk: dict[str, Any], f: Fields) -> PrefillProgress | None:
    """The prefill's progress on a stream chunk, by the first family that reads one
    there (llama-server's `prompt_progress`), whatever the server claimed to be."""
    for family in FAMILIES:
        if family.progress is not None and (said := family.progress(chunk, f)) is not None:
            return said
    return None


def chunk_timings(chunk: dict[str, Any], usage: Usage | None, f: Fields) -> ServerTimings | None:
    """The engine's own timings on a stream chunk (llama-server's `timings`), by the
    first family that reads them there, whatever the server claimed to be."""
    for family in FAMILIES:
        if family.timings is not None and (said := family.timings(chunk, usage, f)) is not None:
            return said
    return None


def timings_source(local: bool) -> str | None:
    """The label an answer's `ServerTimings` are kept under (`Metrics.server_source`), by
    the family that reads them: `local`, counted by the local engine in its shape."""
    return next((fam.timings_source(local) for fam in FAMILIES if fam.timings_source), None)


def said_by(source: str | None) -> str:
    """Who says the figures kept under `source`, as a line names them: its family's
    name for it, else the label itself ("vLLM /metrics"), else "the server"."""
    if source is None:
        return "the server"
    return next((fam.said_by[source] for fam in FAMILIES if source in fam.said_by), source)


def context_refusal(body: str) -> dict[str, object] | None:
    """If an error body says the prompt does not fit the server's window: what it says
    of the sizes (`n_ctx`, `n_prompt_tokens`, either may be missing); else None. Every
    family's refusal is recognised whatever the server claimed to be (a proxy may
    front any of them)."""
    obj = load_json(body)
    err = obj.get("error") if isinstance(obj, dict) else None
    err = err if isinstance(err, dict) else {}
    text = str(err.get("message") or body)
    for family in FAMILIES:
        if family.refusal is not None and (said := family.refusal(err, text)) is not None:
            return said
    return None
