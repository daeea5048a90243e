"""Backend profiles: how a name on the command line or in the config becomes a Backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from phasechat.backends.base import Backend
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.engine_process import EngineProcess
from phasechat.backends.local.models import default_model_path, gemma3_model_path
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.httplog import redact_url

#: Short names for the bundled models, usable wherever a model path is expected.
MODEL_ALIASES = {"smollm2": default_model_path, "gemma3": gemma3_model_path}


def resolve_model_path(value: str | None) -> Path | None:
    """A model path from `--model`: a bundled alias, or a file path (None: the default)."""
    if value is None:
        return None
    if value in MODEL_ALIASES:
        return MODEL_ALIASES[value]()
    return Path(value).expanduser()


#: what a backend is: a model run here, or a server
KINDS = ("local", "remote")
#: the kinds' earlier names, read as the kind they name now
OLD_KINDS = {"openai": "remote"}


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """Which backend to build and with what settings."""

    #: "local" (a model run here) or "remote" (a server); "openai", its old name for a
    #: remote one, is read as "remote"
    kind: str = "local"
    local: LocalConfig = field(default_factory=LocalConfig)
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    local_name: str = "local"  # a config [[local]] profile's name

    def __post_init__(self) -> None:
        kind = OLD_KINDS.get(self.kind, self.kind)
        if kind not in KINDS:
            raise ValueError(f"unknown backend {self.kind!r} (expected local or remote)")
        object.__setattr__(self, "kind", kind)  # frozen: set once, here

    @property
    def is_local(self) -> bool:
        """Whether it is a model run here (else a server)."""
        return self.kind == "local"

    @property
    def name(self) -> str:
        """The profile's label, which answers and per-backend telemetry are keyed by."""
        return self.local_name if self.is_local else self.remote.name

    def named(self, name: str) -> BackendSpec:
        """The same backend under another profile name."""
        if self.is_local:
            return replace(self, local_name=name)
        return replace(self, remote=replace(self.remote, name=name))

    @property
    def describe(self) -> str:
        if self.is_local:
            path = self.local.model_path
            return f"llama.cpp · {path.name if path else 'bundled SmolLM2-135M'}"
        return f"{redact_url(self.remote.base_url)} · {self.remote.model or 'server default'}"


def make_backend(
    spec: BackendSpec, request_headers: Callable[[], Mapping[str, str]] | None = None
) -> Backend:
    """A new, not yet started backend for `spec`; a remote one adds `request_headers()`
    to each chat request (a trace's `traceparent`)."""
    if spec.is_local:
        if spec.local.own_process:
            return EngineProcess(spec.local, name=spec.local_name)
        return LocalBackend(spec.local, name=spec.local_name)
    return RemoteBackend(spec.remote, request_headers=request_headers)
