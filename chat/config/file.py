"""The config file: TOML, found through platformdirs, overridable by PHASECHAT_CONFIG.

```toml
theme = "phasechat-dark"

[engine]
system = "You are a helpful assistant."
temperature = 0.7
max_tokens = 512
stop = ["</s>"]

[[endpoints]]
name = "lab"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen2.5-7b"            # optional: the first model the server lists
api_key_env = "LAB_API_KEY"     # the key itself stays in the environment

[[local]]
name = "gemma"
path = "gemma3"                 # a GGUF path or a bundled alias
n_ctx = 8192
gpu_layers = -1
threads = 4
```

Nothing is read at import time. `load_config` validates everything and raises
`ConfigError`, one line naming the file, the key and the problem. An inline `api_key` is
accepted with a warning (`Config.warnings`); a file holding one is written with mode 0600.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.paths import config_path
from phasechat.chat.config.profiles import resolve_model_path
from phasechat.chat.config.settings import Settings, TrimConfig, load_problems

__all__ = ["Config", "ConfigError", "config_path", "load_config"]


class ConfigError(ValueError):
    """The config file cannot be used; the message is one line: file, key, problem."""


@dataclass(frozen=True, slots=True)
class EndpointProfile:
    """One `[[endpoints]]` entry: an OpenAI-compatible server."""

    name: str
    base_url: str
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    context: int | None = None  # the server's window, where it does not say it
    #: An inline key (discouraged, warned about). repr=False keeps it out of logs.
    api_key: str | None = field(default=None, repr=False)

    def remote_config(self) -> RemoteConfig:
        """The backend config (the key is never part of it: see `install_key`)."""
        return RemoteConfig(
            base_url=self.base_url,
            model=self.model,
            api_key_env=self.api_key_env,
            name=self.name,
            context_window=self.context,
        )

    def install_key(self) -> None:
        """Make an inline key visible to the backend, which reads only `api_key_env`.

        Only in this process's environment, and only where the variable is unset.
        """
        if self.api_key:
            os.environ.setdefault(self.api_key_env, self.api_key)


@dataclass(frozen=True, slots=True)
class LocalProfile:
    """One `[[local]]` entry: a GGUF model and how to load it."""

    name: str
    path: str | None = None  # None: the bundled default model
    n_ctx: int = 4096
    gpu_layers: int | None = None
    threads: int | None = None
    chat_format: str | None = None

    def local_config(self) -> LocalConfig:
        """The backend config (resolves bundled aliases such as `smollm2`)."""
        return LocalConfig(
            model_path=resolve_model_path(self.path),
            n_ctx=self.n_ctx,
            gpu_layers=self.gpu_layers,
            threads=self.threads,
            chat_format=self.chat_format,
        )


@dataclass(frozen=True, slots=True)
class Config:
    """The whole file. `path` is where it was read from; `warnings` are one line each."""

    engine: Settings = field(default_factory=Settings)
    endpoints: tuple[EndpointProfile, ...] = ()
    local: tuple[LocalProfile, ...] = ()
    theme: str | None = None
    trim: TrimConfig = field(default_factory=TrimConfig)
    path: Path | None = field(default=None, compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def endpoint(self, name: str) -> EndpointProfile | None:
        """The endpoint profile called `name`, if any."""
        return next((e for e in self.endpoints if e.name == name), None)

    def local_profile(self, name: str) -> LocalProfile | None:
        """The local profile called `name`, if any."""
        return next((p for p in self.local if p.name == name), None)

    @property
    def has_inline_key(self) -> bool:
        """Whether any endpoint holds its key in the file (then the file is 0600)."""
        return any(e.api_key for e in self.endpoints)


# -- reading ---------------------------------------------------------------------------

_TYPE_NAMES = {
    str: "a string", int: "an integer", float: "a number", list: "a list", bool: "true or false"
}  # fmt: skip


class _Reader:
    """Checks values against the schema, naming the file and key in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.warnings: list[str] = []

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {problem}")

    def table(self, value: object, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {_show(value)}")
        for k in value:
            if k not in allowed:
                raise self.fail(
                    f"{key}.{k}" if key else k,
                    f"unknown key (expected one of: {', '.join(allowed)})",
                )
        return value

    def get(self, table: dict[str, Any], key: str, where: str, kind: type, default: Any) -> Any:
        full = f"{where}.{key}" if where else key
        if key not in table:
            if default is _REQUIRED:
                raise self.fail(full, "missing (required)")
            return default
        value = table[key]
        # bool is an int in Python but never a valid count or temperature here.
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise self.fail(full, f"expected {_TYPE_NAMES[kind]}, got {_show(value)}")
        if kind is list:
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    raise self.fail(f"{full}[{i}]", f"expected a string, got {_show(item)}")
            return tuple(value)
        return value

    def check(self, ok: bool, key: str, problem: str) -> None:
        if not ok:
            raise self.fail(key, problem)


_REQUIRED = object()


def _show(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value) if isinstance(value, str) else str(value).lower()


def _engine(r: _Reader, raw: object) -> Settings:
    names = tuple(f.name for f in fields(Settings))
    t = r.table(raw, "engine", names)
    d = Settings()
    e = Settings(
        system=r.get(t, "system", "engine", str, d.system),
        temperature=r.get(t, "temperature", "engine", float, d.temperature),
        max_tokens=r.get(t, "max_tokens", "engine", int, d.max_tokens),
        stop=r.get(t, "stop", "engine", list, d.stop),
        seed=r.get(t, "seed", "engine", int, None),
    )
    for key, problem in e.problems():
        raise r.fail(f"engine.{key}", problem)
    return e


def _endpoint(r: _Reader, raw: object, where: str) -> EndpointProfile:
    t = r.table(raw, where, tuple(f.name for f in fields(EndpointProfile)))
    p = EndpointProfile(
        name=r.get(t, "name", where, str, _REQUIRED),
        base_url=r.get(t, "base_url", where, str, _REQUIRED),
        model=r.get(t, "model", where, str, None),
        api_key_env=r.get(t, "api_key_env", where, str, "OPENAI_API_KEY"),
        context=r.get(t, "context", where, int, None),
        api_key=r.get(t, "api_key", where, str, None),
    )
    r.check(
        p.base_url.startswith(("http://", "https://")),
        f"{where}.base_url",
        f"expected an http:// or https:// URL, got {p.base_url!r}",
    )
    r.check(bool(p.api_key_env.strip()), f"{where}.api_key_env", "must not be empty")
    for key, problem in load_problems(context=p.context):
        raise r.fail(f"{where}.{key}", problem)
    if p.api_key:
        r.warnings.append(
            f"{r.path}: {where}.api_key: a key written in the config file; prefer "
            f"api_key_env (the file is kept at mode 0600)"
        )
    return p


def _local(r: _Reader, raw: object, where: str) -> LocalProfile:
    t = r.table(raw, where, tuple(f.name for f in fields(LocalProfile)))
    p = LocalProfile(
        name=r.get(t, "name", where, str, _REQUIRED),
        path=r.get(t, "path", where, str, None),
        n_ctx=r.get(t, "n_ctx", where, int, 4096),
        gpu_layers=r.get(t, "gpu_layers", where, int, None),
        threads=r.get(t, "threads", where, int, None),
        chat_format=r.get(t, "chat_format", where, str, None),
    )
    for key, problem in load_problems(p.n_ctx, p.gpu_layers, p.threads):
        raise r.fail(f"{where}.{key}", problem)
    return p


def _profiles(
    r: _Reader, doc: dict[str, Any], key: str, one: Callable[..., Any]
) -> tuple[Any, ...]:
    raw = doc.get(key, [])
    if not isinstance(raw, list):
        raise r.fail(key, f"expected an array of tables ([[{key}]]), got {_show(raw)}")
    out = tuple(one(r, item, f"{key}[{i}]") for i, item in enumerate(raw))
    seen: set[str] = set()
    for i, p in enumerate(out):
        r.check(p.name not in seen, f"{key}[{i}].name", f"duplicate name {p.name!r}")
        seen.add(p.name)
    return out


def parse_config(text: str, path: Path) -> Config:
    """A Config from TOML text; `path` is only used in messages and `Config.path`."""
    r = _Reader(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    r.table(doc, "", ("engine", "endpoints", "local", "theme", "trim"))
    engine = _engine(r, doc["engine"]) if "engine" in doc else Settings()
    endpoints = _profiles(r, doc, "endpoints", _endpoint)
    local = _profiles(r, doc, "local", _local)
    theme = r.get(doc, "theme", "", str, None)
    trim = _trim(r, doc["trim"]) if "trim" in doc else TrimConfig()
    return Config(engine, endpoints, local, theme, trim, path, tuple(r.warnings))


def _trim(r: _Reader, raw: object) -> TrimConfig:
    t = r.table(raw, "trim", tuple(f.name for f in fields(TrimConfig)))
    c = TrimConfig(
        enabled=r.get(t, "enabled", "trim", bool, True),
        budget=r.get(t, "budget", "trim", int, None),
        keep_last=r.get(t, "keep_last", "trim", int, 4),
        summarizer=r.get(t, "summarizer", "trim", str, None),
    )
    for key, problem in c.problems():
        raise r.fail(f"trim.{key}", problem)
    return c


def load_config(path: Path | None = None) -> Config:
    """Read the config (default: `config_path()`); a missing file is the defaults."""
    path = path or config_path()
    if path.exists() and not path.is_file():  # a FIFO would block the start for ever
        raise ConfigError(f"{path}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config(path=path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    config = parse_config(text, path)
    if config.has_inline_key and os.name == "posix" and path.stat().st_mode & 0o077:
        warning = f"{path}: holds an API key but others can read it (chmod 600 it)"
        config = Config(**{**_fields(config), "warnings": (*config.warnings, warning)})
    return config


def _fields(config: Config) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(Config)}
