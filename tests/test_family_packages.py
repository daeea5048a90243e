"""One package per server family (issue 46): `backends/remote/servers/<family>/` holds all that
is one server's, `FAMILIES` lists exactly those packages, and code outside
backends/remote/servers/ reaches a family only through its `ServerFamily` hooks, never by
importing its package."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from phasechat.backends.remote.servers import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "backends" / "remote" / "servers"
PACKAGES = sorted(p.name for p in SERVERS.iterdir() if (p / "__init__.py").is_file())
#: where the code that is not one family's lives (the layers and the commands)
GENERIC = ("backends", "telemetry", "chat", "tui", "phasechat/cli")


def test_families_lists_each_familys_package_once() -> None:
    owned = [
        importlib.import_module(f"phasechat.backends.remote.servers.{p}").FAMILY for p in PACKAGES
    ]
    assert len(PACKAGES) == 8 and "llama_server" in PACKAGES and "vllm" in PACKAGES
    assert sorted(f.name for f in owned) == sorted(f.name for f in FAMILIES)
    assert all(any(f is g for g in FAMILIES) for f in owned)


def family_imports(path: Path) -> list[str]:
    """`line: module` for each import of a family's package (or a module in it)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:4] == ["phasechat", "backends", "remote", "servers"] and parts[4:5] in (
                [p] for p in PACKAGES
            ):
                hits.append(f"{node.lineno}: {name}")
                break
    return hits


def test_nothing_outside_the_servers_folder_imports_a_family() -> None:
    sources = [
        path
        for top in GENERIC
        for path in (ROOT / top).rglob("*.py")
        if SERVERS not in path.parents and "__pycache__" not in path.parts
    ]
    assert ROOT / "backends" / "remote" / "openai_wire.py" in sources
    assert ROOT / "telemetry" / "metrics.py" in sources
    found = {str(p.relative_to(ROOT)): hits for p in sources if (hits := family_imports(p))}
    assert found == {}


def test_the_import_check_sees_each_spelling(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text(
        "import phasechat.backends.remote.servers.vllm.teacher\n"
        "from phasechat.backends.remote.servers import llama_server, detect\n"
        "from phasechat.backends.remote.servers.dynamo import FAMILY\n"
        "from phasechat.backends.remote.servers import detect\n"
        "from phasechat.backends.remote.servers.forcing import Server\n"
    )
    assert family_imports(source) == [
        "1: phasechat.backends.remote.servers.vllm.teacher",
        "2: phasechat.backends.remote.servers.llama_server",
        "3: phasechat.backends.remote.servers.dynamo",
    ]
