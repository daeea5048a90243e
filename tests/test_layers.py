"""Nothing below tui/ loads Textual.

The import graph itself (layers, Textual and Rich forbidden below tui) is checked by
import-linter (`lint-imports`, contracts in pyproject.toml); this test checks the
running interpreter: importing the core and the headless commands loads no Textual.
"""

from __future__ import annotations

import subprocess
import sys


def test_core_packages_do_not_load_textual() -> None:
    code = (
        "import sys, phasechat.backends.local.backend, phasechat.backends.remote.backend, "
        "phasechat.backends.remote.sse, "
        "phasechat.telemetry.metrics, phasechat.telemetry.live, phasechat.chat.turns, "
        "phasechat.chat.config.profiles, phasechat.cli.main, phasechat.cli.commands.doctor; "
        "bad = [m for m in sys.modules if m.split('.')[0] == 'textual']; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
