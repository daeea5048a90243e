"""Backend profiles: how a name on the command line or in the config becomes a Backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """Which backend to build and with what settings."""

    kind: str = "local"  # "local" or "openai"
    local: LocalConfig = field(default_factory=LocalConfig)
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    local_name: str = "local"  # a config [[local]] profile's name

    @property
    def name(self) -> str:
        """The profile's label, which answers and per-backend telemetry are keyed by."""
        return self.local_name if self.kind == "local" else self.remote.name

    @property
    def describe(self) -> str:
        if self.kind == "local":
            path = self.local.model_path
            return f"llama.cpp · {path.name if path else 'bundled SmolLM2-135M'}"
        return f"{redact_url(self.remote.base_url)} · {self.remote.model or 'server default'}"


def make_backend(
    spec: BackendSpec, request_headers: Callable[[], Mapping[str, str]] | None = None
) -> Backend:
    """A new, not yet started backend for `spec`; a remote one adds `request_headers()`
    to each chat request (a trace's `traceparent`)."""
    if spec.kind == "local":
        if spec.local.own_process:
            return EngineProcess(spec.local, name=spec.local_name)
        return LocalBackend(spec.local, name=spec.local_name)
    if spec.kind == "openai":
        return RemoteBackend(spec.remote, request_headers=request_headers)
    raise ValueError(f"unknown backend {spec.kind!r} (expected local or openai)")
