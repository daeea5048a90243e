"""What the layers above may ask of a backend that is a server, beyond the `Backend`
contract: where it is, which family of server it is, and how it reads a token sequence
teacher-forced. A `Protocol` checked with `isinstance`, which `RemoteBackend` is."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from phasechat.backends.base import Backend
from phasechat.backends.remote.servers.family import ServerFamily
from phasechat.backends.remote.servers.forcing import Forcing, Server


@runtime_checkable
class RemoteServer(Backend, Protocol):
    """A `Backend` that asks a server over HTTP."""

    @property
    def base_url(self) -> str:
        """The base URL the user gave (it may hold credentials: never shown as it is)."""
        ...

    @property
    def family(self) -> ServerFamily:
        """Which server it is (vLLM, llama-server, ...), as its listing said."""
        ...

    def teacher(self) -> tuple[Forcing, Server] | None:
        """How this server reads a given token sequence, teacher-forced, and where it
        is; None: its family cannot, or it is not ready."""
        ...
