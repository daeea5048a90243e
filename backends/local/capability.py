"""What the layers above may ask of a model run here, beyond the `Backend` contract: its
model file and the engine setting it loaded with, its prompt's token ids, its geometry.
Each is a `Protocol` checked with `isinstance`, which `LocalBackend` and the engine in a
child process (`EngineProcess`) both are, and a remote backend is not."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.gguf import Geometry


@runtime_checkable
class ModelFile(Protocol):
    """A side whose model is a file here, with the engine setting it loaded with: what
    teacher forcing reads it with (chat/trips/forced_sides.py)."""

    @property
    def model_path(self) -> Path | None:
        """The GGUF file (None: the bundled model was not found)."""
        ...

    #: the settings it was made with (its KV type, its context)
    config: LocalConfig

    @property
    def flash_attn(self) -> bool | None:
        """Flash attention as loaded (None: not loaded yet)."""
        ...

    @property
    def threads(self) -> int:
        """The threads it decodes with (0: not loaded yet)."""
        ...

    @property
    def gpu_layers(self) -> int:
        """The layers on a GPU as loaded: 0 none, -1 all."""
        ...


@runtime_checkable
class PromptIds(Protocol):
    """A side that says which token ids its own model reads a prompt as."""

    async def prompt_ids(self, messages: tuple[Message, ...]) -> list[int] | None:
        """The chat-templated prompt's token ids (None: not loaded, or the template
        refuses the messages)."""
        ...


@runtime_checkable
class LocalEngine(ModelFile, PromptIds, Backend, Protocol):
    """A `Backend` that runs a GGUF model here, in this process or a child of its own."""

    @property
    def geometry(self) -> Geometry | None:
        """The model's KV geometry and weights, read from its file (None: not loaded)."""
        ...

    @property
    def model_bytes(self) -> int:
        """The bytes of its weights (0: not loaded)."""
        ...

    @property
    def flash_note(self) -> str:
        """How flash attention was chosen, as the status line says it ("": not loaded)."""
        ...
