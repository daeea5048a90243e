"""Where each module of the installed package lives in the repository: the layers'
top-level folders mapped into `phasechat.*` by pyproject.toml's
`[tool.setuptools.package-dir]` (setup.py builds the wheel from the same table).

For the tools that walk a package's folder on disk (mypy, import-linter's grimp,
mutmut, the layout table): the module names with their files, and a copy of the package
as a wheel lays it out, in real folders. A repository with no such table (a test's
small tree) is its own layout: `pkg.core.a` is `pkg/core/a.py`.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path


def package_dirs(root: Path) -> dict[str, Path]:
    """Each mapped package's folder (`phasechat.chat` -> `root/chat`), from `root`'s
    pyproject.toml; none when it maps nothing. A mapped folder that is not there (in a
    copy laid out as a wheel, scripts/mutants.py's) is looked for inside its package."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    tool = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
    mapped = tool.get("setuptools", {}).get("package-dir", {})
    return {name: root / dir for name, dir in mapped.items() if name and (root / dir).is_dir()}


def folder_of(root: Path, package: str) -> Path:
    """The folder that holds package `package`'s modules: its mapped folder or the one
    below the nearest mapped package above it, else its own path under `root`."""
    mapped = package_dirs(root)
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        if (name := ".".join(parts[:cut])) in mapped:
            return mapped[name].joinpath(*parts[cut:])
    return root.joinpath(*parts)


def module_file(root: Path, name: str) -> Path | None:
    """The file of module or package `name` (a package's `__init__.py`), None if none."""
    package, _, last = name.rpartition(".")
    base = folder_of(root, name)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if package and (folder_of(root, package) / f"{last}.py").is_file():
        return folder_of(root, package) / f"{last}.py"
    if not package and (root / f"{last}.py").is_file():
        return root / f"{last}.py"
    return None


def _walk(folder: Path, prefix: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for where, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        parts = prefix + Path(where).relative_to(folder).parts
        for file in files:
            if file.endswith(".py"):
                stem = file.removesuffix(".py")
                name = ".".join(parts if stem == "__init__" else (*parts, stem))
                found[name] = Path(where) / file
    return found


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` by name, with its file: its own folder's, and each
    mapped package's inside it (a mapped folder's subpackages found, never listed)."""
    found = _walk(folder_of(root, package), tuple(package.split(".")))
    for name, folder in package_dirs(root).items():
        if name.startswith(package + "."):
            found.update(_walk(folder, tuple(name.split("."))))
    return found


def copy_package(root: Path, package: str, dest: Path) -> Path:
    """`package` copied under `dest` as a wheel lays it out (its mapped folders as real
    folders inside it, its package data beside its modules); the copy's top folder."""
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    top = dest / package.split(".")[0]
    shutil.copytree(folder_of(root, package), dest.joinpath(*package.split(".")), ignore=junk)
    for name, folder in package_dirs(root).items():
        if name.startswith(package + "."):
            shutil.copytree(folder, dest.joinpath(*name.split(".")), ignore=junk)
    return top
