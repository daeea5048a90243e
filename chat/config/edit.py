"""Changing the config's profiles: one endpoint added, a profile removed or renamed, an
endpoint's model chosen. Each returns a new `Config` (written by chat/config/write.py,
which edits only the table that changed) or raises ValueError, one line saying why.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TypeVar

from phasechat.backends.remote.urls import server_key
from phasechat.chat.config.file import Config, EndpointProfile, LocalProfile

P = TypeVar("P", EndpointProfile, LocalProfile)

#: Names the command line gives a meaning of its own (`--backend local`, `openai`).
BUILT_IN = ("local", "openai")
#: What a profile's name may hold: it is typed after `--backend` and shown in one line.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def names(config: Config) -> list[str]:
    """Every profile's name in the file: endpoints, then local models."""
    return [*(e.name for e in config.endpoints), *(p.name for p in config.local)]


def check_name(config: Config, name: str) -> None:
    """Refuse a name that is taken, built in, or not typeable as `--backend NAME`."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"bad profile name {name[:64]!r}: letters, digits and . _ : - (at most 64)"
        )
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in backend's name: choose another")
    if name in names(config):
        raise ValueError(f"a profile called {name!r} exists already")


def free_name(config: Config, base: str) -> str:
    """`base` made into a profile name no profile has yet (`llama-server-2`, ...)."""
    stem = re.sub(r"[^A-Za-z0-9._:-]+", "-", base).strip("-._:")[:56] or "server"
    taken = {*names(config), *BUILT_IN}
    if stem not in taken:
        return stem
    return next(f"{stem}-{i}" for i in range(2, len(taken) + 3) if f"{stem}-{i}" not in taken)


def endpoint_at(config: Config, base_url: str) -> str | None:
    """The name of the endpoint that reaches the same server as `base_url` (the same
    scheme, host, port, path and query; a final "/" or "/v1" aside), if any."""
    key = server_key(base_url)
    return next((e.name for e in config.endpoints if server_key(e.base_url) == key), None)


def add_endpoint(config: Config, endpoint: EndpointProfile) -> Config:
    """`config` with `endpoint` as its last `[[endpoints]]` table."""
    check_name(config, endpoint.name)
    endpoint.remote_config()  # refuses a URL no request could go to
    return replace(config, endpoints=(*config.endpoints, endpoint))


def _in_file(config: Config, name: str) -> None:
    if name not in names(config):
        where = " (built in, not in the config file)" if name in BUILT_IN else ""
        raise ValueError(f"no profile called {name!r} in the config file{where}")


def remove_profile(config: Config, name: str) -> Config:
    """`config` without profile `name` (a summarizer it was: trimming keeps no summarizer)."""
    _in_file(config, name)
    return _renamed(config, name, None)


def rename_profile(config: Config, old: str, new: str) -> Config:
    """`config` with profile `old` called `new` where it stands (the summarizer too)."""
    _in_file(config, old)
    check_name(config, new)
    return _renamed(config, old, new)


def _renamed(config: Config, old: str, new: str | None) -> Config:
    """Profile `old` called `new` where it stands, or gone (None); the summarizer too."""
    trim = config.trim
    if trim.summarizer == old:
        trim = replace(trim, summarizer=new)

    def each(profiles: tuple[P, ...]) -> tuple[P, ...]:
        if new is None:
            return tuple(p for p in profiles if p.name != old)
        return tuple(replace(p, name=new) if p.name == old else p for p in profiles)

    return replace(config, endpoints=each(config.endpoints), local=each(config.local), trim=trim)


def choose_model(config: Config, name: str, model: str) -> Config:
    """`config` with endpoint `name` asking for `model`."""
    if config.endpoint(name) is None:
        raise ValueError(f"no endpoint called {name!r} in the config file")
    return replace(
        config,
        endpoints=tuple(replace(e, model=model) if e.name == name else e for e in config.endpoints),
    )
