"""Installed, phasechat is one name: a built wheel's only top-level package is `phasechat`
(the layers live in top-level folders of the repository, linked under phasechat/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from phasechat import LAYERS

ROOT = Path(__file__).resolve().parent.parent


def test_each_layer_is_linked_into_the_one_package() -> None:
    for name in LAYERS:
        link = ROOT / "phasechat" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), name


def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    # From a copy, as a clean clone would build it (setuptools leaves build/ behind).
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".*", "build", "tests", "bench", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, src, symlinks=True, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("phasechat-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "phasechat",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    for layer in LAYERS:  # real files, not links, under phasechat/
        assert f"phasechat/{layer}/__init__.py" in names, layer
    assert "phasechat/tui/app.tcss" in names and "phasechat/backends/local/backend.py" in names
