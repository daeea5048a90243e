"""Installed, phasechat is one name: a built wheel's only top-level package is `phasechat`.
The layers live in top-level folders of the repository, mapped into it by pyproject.toml's
`[tool.setuptools.package-dir]` with no symbolic links, so a clone that cannot hold links
(`core.symlinks=false`, Git for Windows' usual setting, a zip download) builds the whole
wheel, and runs from its own folder too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from phasechat import LAYERS

ROOT = Path(__file__).resolve().parent.parent


def test_each_layer_is_mapped_into_the_one_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = pyproject["tool"]["setuptools"]["package-dir"]
    assert mapped == {f"phasechat.{name}": name for name in LAYERS}
    for name in LAYERS:  # one place only: no link, no folder of that name in phasechat/
        assert (ROOT / name / "__init__.py").is_file(), name
        assert not os.path.lexists(ROOT / "phasechat" / name), name


def git(*args: str | Path) -> str:
    return subprocess.run(
        ["git", *map(str, args)], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()


@pytest.fixture(scope="module")
def clone_without_links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `git clone -c core.symlinks=false` of this repository at HEAD, with this
    working tree's uncommitted changes to tracked files (edits, deletions) and its new
    files copied in, so the code under edit is what is built. Nothing is written to the
    repository itself; nothing is fetched (the clone is of the local checkout)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: there is nothing to clone")
    dest = tmp_path_factory.mktemp("clone") / "phasechat"
    head = git("-C", ROOT, "rev-parse", "HEAD")
    git("clone", "-q", "--no-checkout", "-c", "core.symlinks=false", ROOT, dest)
    git("-C", dest, "checkout", "-q", head)
    changed = git("-C", ROOT, "diff", "--name-only", "HEAD").splitlines()
    new = git("-C", ROOT, "ls-files", "--others", "--exclude-standard").splitlines()
    for name in changed + new:
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, dest / name)
        elif not os.path.lexists(ROOT / name) and os.path.lexists(dest / name):
            (dest / name).unlink()
    return dest


@pytest.fixture(scope="module")
def wheel(clone_without_links: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel` builds from the clone, offline: no index, and the build
    backend this environment has (setuptools, from the dev extras)."""
    setuptools = version("setuptools")
    if int(setuptools.split(".")[0]) < 77:  # before PEP 639's `license = "MIT"`
        pytest.fail(f"setuptools {setuptools} here; the dev extras need >=77: scripts/setup.sh dev")
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(clone_without_links)],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (built,) = out.glob("phasechat-*.whl")
    return built


def test_the_clone_really_has_no_links(clone_without_links: Path) -> None:
    assert git("-C", clone_without_links, "config", "core.symlinks") == "false"
    # mode 120000 is a link in git's index: none left in the tree for a clone to lose
    entries = [
        line.split() for line in git("-C", clone_without_links, "ls-files", "-s").splitlines()
    ]
    links = [e[-1] for e in entries if e[0] == "120000" and (clone_without_links / e[-1]).exists()]
    assert links == [] and len(entries) > 300


def test_the_wheel_holds_every_module_of_each_layer(wheel: Path, clone_without_links: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = git("-C", clone_without_links, "ls-files", "*.py").splitlines()
    expected = {f"phasechat/{path}" for path in tracked if path.split("/")[0] in LAYERS}
    expected |= {path for path in tracked if path.startswith("phasechat/")}
    # the subpackages too (backends/servers/vllm/...), found without being listed
    assert len(expected) > 150 and deepest_package(expected).count(".") >= 3
    assert sorted(expected - names) == []
    assert {n for n in names if n.endswith(".py")} == expected  # and nothing else


def deepest_package(paths: set[str]) -> str:
    """The most deeply nested package of the layers among `paths` (wheel entries), by
    its dotted name: one that only a mapping that finds subpackages installs."""
    inits = [p for p in paths if p.endswith("/__init__.py") and p.split("/")[1] in LAYERS]
    return (
        max(sorted(inits), key=lambda p: p.count("/"))
        .removesuffix("/__init__.py")
        .replace("/", ".")
    )


def test_an_install_of_the_wheel_runs_from_its_own_files(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
         "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    # the dependencies from this environment; phasechat only from the target (not the
    # repository: PYTHONPATH is the target alone and the folder is elsewhere)
    deep = deepest_package(set(zipfile.ZipFile(wheel).namelist()))  # backends.servers.<one>
    code = f"import phasechat.tui.app as m, {deep} as d; print(m.__file__, d.__file__)"
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    app, deep_file = r.stdout.split()
    assert Path(app) == target / "phasechat" / "tui" / "app.py"
    assert Path(deep_file) == target.joinpath(*deep.split("."), "__init__.py")


def test_a_clone_without_links_runs_from_its_own_folder(clone_without_links: Path) -> None:
    # a source tree (PYTHONPATH=<checkout>, an editable install): phasechat/__init__.py
    # finds the layers beside it, in this checkout, not in another one installed
    r = subprocess.run(
        [sys.executable, "-c", "import phasechat.tui.app as m; print(m.__file__, m.__name__)"],
        cwd=clone_without_links.parent,
        env={**os.environ, "PYTHONPATH": str(clone_without_links)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(clone_without_links / "tui" / "app.py"), "phasechat.tui.app"]


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "phasechat",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    for layer in LAYERS:  # real files, not links, under phasechat/
        assert f"phasechat/{layer}/__init__.py" in names, layer
    assert "phasechat/tui/app.tcss" in names and "phasechat/backends/local/backend.py" in names
