"""What a backend can do beyond the contract, said by the protocols it satisfies
(backends/local/capability.py, backends/remote/capability.py) and checked with
`isinstance`: on the real backends, made and never started (no model loaded, no
server asked), and on the scripted one that stands in for neither."""

from __future__ import annotations

from pathlib import Path

from phasechat.backends.base import Backend
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.capability import LocalEngine, ModelFile, PromptIds
from phasechat.backends.local.engine_process import EngineProcess, EngineState
from phasechat.backends.local.gguf import Geometry
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.capability import RemoteServer
from tests.scripted import ScriptedBackend


def local_engines(here: LocalBackend, child: EngineProcess) -> list[LocalEngine]:
    """mypy's half of the check: both are local engines as the protocol types them."""
    return [here, child]


def remote_servers(remote: RemoteBackend) -> list[RemoteServer]:
    return [remote]


def test_each_backend_says_what_it_is_and_nothing_else(tmp_path: Path) -> None:
    config = LocalConfig(model_path=tmp_path / "m.gguf")
    here, child = LocalBackend(config), EngineProcess(config)
    remote = RemoteBackend(RemoteConfig(base_url="http://127.0.0.1:9/v1"))
    scripted = ScriptedBackend()
    for engine in local_engines(here, child):
        assert isinstance(engine, Backend) and isinstance(engine, LocalEngine)
        assert isinstance(engine, ModelFile) and isinstance(engine, PromptIds)
        assert not isinstance(engine, RemoteServer)
    for server in remote_servers(remote):
        assert isinstance(server, Backend) and isinstance(server, RemoteServer)
        assert not isinstance(server, ModelFile) and not isinstance(server, PromptIds)
    assert isinstance(scripted, Backend)
    for capability in (LocalEngine, ModelFile, PromptIds, RemoteServer):
        assert not isinstance(scripted, capability)


def test_the_engine_process_says_what_its_child_said(tmp_path: Path) -> None:
    child = EngineProcess(LocalConfig(model_path=tmp_path / "m.gguf"))
    before = (child.geometry, child.gpu_layers, child.threads, child.model_bytes)
    assert before == (None, 0, 0, 0)
    assert (child.flash_attn, child.flash_note) == (None, "")
    geometry = Geometry("llama", "m", 30, 9, 3, 64, 64, 2048, None, 0, 1 << 20)
    child._said = EngineState(
        "ready",
        "ok",
        "m.gguf",
        tmp_path / "m.gguf",
        2048,
        geometry,
        -1,
        3,
        123,
        "flash on",
        7,
        True,
    )
    after = (child.geometry, child.gpu_layers, child.threads, child.model_bytes)
    assert after == (geometry, -1, 3, 123)
    assert (child.flash_attn, child.flash_note) == (True, "flash on")
