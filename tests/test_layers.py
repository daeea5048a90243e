"""Nothing below tui/ imports Textual or Rich.

Checked twice: in a clean interpreter (Textual must not be loaded at all), and in the
source (no module below tui/ imports textual or rich; httpx alone may load rich for its
optional command line when click is installed, which is not ours to change).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("backends", "telemetry", "chat", "phasechat")


def test_core_packages_do_not_load_textual() -> None:
    code = (
        "import sys, backends.local, backends.openai, backends.sse, telemetry.metrics, "
        "telemetry.live, chat.session, chat.profiles, phasechat.cli, phasechat.doctor; "
        "bad = [m for m in sys.modules if m.split('.')[0] == 'textual']; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_core_module_imports_textual_or_rich() -> None:
    offenders = []
    for package in CORE:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                if package == "phasechat" and path.name == "cli.py":
                    names = [n for n in names if n != "tui.app"]  # the TUI entry point
                offenders += [
                    f"{path.name}: {n}"
                    for n in names
                    if n.split(".")[0] in ("textual", "rich", "tui")
                ]
    assert offenders == []
