"""The layers live in top-level folders mapped into phasechat/ (pyproject.toml says how):
they have one name, `phasechat.<layer>`. (A clone without symbolic links, built and run:
test_packaging.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

from phasechat import LAYERS

ROOT = Path(__file__).resolve().parent.parent


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
