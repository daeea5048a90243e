"""Every module of the package sits in a layer of an import-linter contract.

import-linter checks only the modules its contracts name: a module named by none (a new
command beside the others, a new top-level folder) would import anything, unchecked. The
contracts name packages (`phasechat.cli.commands`, `phasechat.chat`, ...), so a module is
covered when it, or a package above it, is in a layer of a `layers` contract. The packages
above the layers (`phasechat` itself, `phasechat.cli`) are in none; they must then import
nothing of the package, or their imports would be the unchecked ones.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.test_layout_doc import layout_doc, write_tree

ROOT = Path(__file__).resolve().parent.parent


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Each module of `package` under `root` (its own folder and the top-level folders
    mapped into it, scripts/package_map.py), by name."""
    found: dict[str, Path] = layout_doc.modules_of(root, package)
    return found


def layered(root: Path) -> set[str]:
    """Every module or package that a layer of a `layers` contract names."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    layers = layout_doc.layers_of(pyproject)
    return {n.strip("()") for contract in layers for layer in contract for n in layer}


def imports_of(path: Path, package: str) -> list[str]:
    """The modules of `package` that the file at `path` imports."""
    names = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." if node.level else node.module or "")
    return [n for n in names if n == "." or n.split(".")[0] == package]


def uncovered(root: Path, package: str) -> list[str]:
    """The modules of `package` in no layer, and the packages above the layers that
    import something of the package (each with what it imports)."""
    names = layered(root)
    out = []
    for name, path in sorted(modules_of(root, package).items()):
        if any(name == n or name.startswith(n + ".") for n in names):
            continue
        if any(n.startswith(name + ".") for n in names):  # above the layers
            out += [f"{name} imports {i}" for i in imports_of(path, package)]
        else:
            out.append(name)
    return out


def test_every_module_of_phasechat_is_in_a_layer() -> None:
    found = modules_of(ROOT, "phasechat")
    # the walk goes through the mapped folders: the layers' own modules are there
    assert {"phasechat.backends.base", "phasechat.tui.app", "phasechat.chat.turns"} <= set(found)
    assert "phasechat.cli.commands.endpoints_cli" in found and len(found) > 150
    assert uncovered(ROOT, "phasechat") == [], "add these to a layer in pyproject.toml"


def test_a_module_in_no_layer_is_found(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[[tool.importlinter.contracts]]\n"
        'name = "top"\ntype = "layers"\nlayers = ["pkg.ui", "pkg.cli.commands | pkg.core"]\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "inside"\ntype = "layers"\ncontainers = ["pkg.core"]\nlayers = ["a", "(b)"]\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "other"\ntype = "forbidden"\nsource_modules = ["pkg.loose"]\n'
    )
    files = {
        "pkg/__init__.py": "import os",
        "pkg/ui.py": "from pkg.core import a",
        "pkg/loose.py": "",  # only in a forbidden contract: in no layer
        "pkg/cli/__init__.py": "from pkg.cli.commands import run",  # above the layers
        "pkg/cli/commands/__init__.py": "",
        "pkg/cli/commands/run.py": "",
        "pkg/cli/new_cli.py": "",  # beside the commands' package, not in it
        "pkg/core/__init__.py": "",
        "pkg/core/a.py": "",
        "pkg/core/b.py": "",
    }
    write_tree(tmp_path, files)
    assert uncovered(tmp_path, "pkg") == [
        "pkg.cli imports pkg.cli.commands",
        "pkg.cli.new_cli",
        "pkg.loose",
    ]
    # once named, each is covered; the root importing only the standard library is fine
    (tmp_path / "pkg/cli/__init__.py").write_text("")
    text = (tmp_path / "pyproject.toml").read_text()
    text = text.replace('"pkg.ui",', '"pkg.ui | pkg.loose", "pkg.cli.new_cli",')
    (tmp_path / "pyproject.toml").write_text(text)
    assert uncovered(tmp_path, "pkg") == []
