"""The layers live in top-level folders linked under phasechat/ (pyproject.toml says
why): they have one name, `phasechat.<layer>`, and a clone that cannot hold the links
stops at once, in one line that names the fix, at set-up and at import."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from phasechat import LAYERS

ROOT = Path(__file__).resolve().parent.parent
FIX = (
    "phasechat/backends is a text file: this clone has no symlinks; "
    "clone with `git clone -c core.symlinks=true`"
)


def layer_imports(path: Path) -> list[str]:
    """`line: name` for each absolute import of a layer by its top-level name."""
    hits = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        hits += [f"{node.lineno}: {name}" for name in names if name.split(".")[0] in LAYERS]
    return hits


def test_nothing_imports_a_layer_by_its_top_level_name() -> None:
    # From the repository root `chat.turns` imports too, as a second module object beside
    # `phasechat.chat.turns`, with state of its own: every import must name phasechat.
    skip = {"build", "__pycache__"}
    sources = [
        path
        for path in ROOT.rglob("*.py")
        if not any(p.startswith(".") or p in skip for p in path.relative_to(ROOT).parts)
    ]
    assert ROOT / "chat" / "turns.py" in sources and ROOT / "tests" / "conftest.py" in sources
    found = {str(p.relative_to(ROOT)): hits for p in sources if (hits := layer_imports(p))}
    assert found == {}


def test_the_import_check_sees_each_spelling(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text(
        "import os, telemetry.metrics\n"
        "from chat.turns import TurnController\n"
        "from phasechat.backends import events\n"
        "from .tui import app\n"
        "def f():\n    import themes\n"
    )
    assert layer_imports(source) == ["1: telemetry.metrics", "2: chat.turns", "6: themes"]


@pytest.fixture(scope="module")
def clone_without_links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `git clone -c core.symlinks=false` of this repository at HEAD, with this
    working tree's uncommitted edits to tracked files copied in (so the code under edit
    is what runs). Nothing is written to the repository itself."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: there is nothing to clone")
    dest = tmp_path_factory.mktemp("clone") / "phasechat"
    head = git("-C", ROOT, "rev-parse", "HEAD")
    git("clone", "-q", "--no-checkout", "-c", "core.symlinks=false", ROOT, dest)
    git("-C", dest, "checkout", "-q", head)
    for name in git("-C", ROOT, "diff", "--name-only", "HEAD").splitlines():
        edited = ROOT / name
        if edited.is_file() and not edited.is_symlink():
            shutil.copyfile(edited, dest / name)
    return dest


def git(*args: str | Path) -> str:
    return subprocess.run(
        ["git", *map(str, args)], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()


def test_the_clone_really_has_no_links(clone_without_links: Path) -> None:
    link = clone_without_links / "phasechat" / "backends"
    assert not link.is_symlink() and link.read_text() == "../backends"


def test_importing_a_clone_without_links_names_the_fix(clone_without_links: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", "import phasechat"],
        cwd=clone_without_links,
        env={**os.environ, "PYTHONPATH": str(clone_without_links)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert f'"{clone_without_links / "phasechat" / "__init__.py"}"' in r.stderr  # the clone's
    assert r.stderr.splitlines()[-1] == f"ImportError: {FIX}"


def test_set_up_of_a_clone_without_links_stops_before_building(
    clone_without_links: Path, tmp_path: Path
) -> None:
    home = {var: str(tmp_path / var) for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
    r = run_group(
        ["bash", "scripts/setup.sh", "dev"],
        cwd=clone_without_links,
        env={**os.environ, **home, "PYTHON": sys.executable},
    )
    assert (r.returncode, r.stdout, r.stderr) == (1, "", FIX + "\n")
    assert not (clone_without_links / ".venv").exists()  # stopped before creating anything


def run_group(
    cmd: Sequence[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run in a session of its own and kill the whole group on timeout: a set-up that
    failed to stop would otherwise leave a pip build behind the killed shell."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
