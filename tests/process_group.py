"""A real server the tests start in a process group of its own (vLLM's engine and
Dynamo's frontend run children of their own): started with its output in a log, stopped
with SIGTERM to the whole group, then SIGKILL if it lingers."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path


def spawn(argv: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """`argv` running in a new session (its own process group), stdout and stderr in `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes], wait_s: float = 20) -> None:
    """SIGTERM to `proc`'s group, then SIGKILL after `wait_s` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
