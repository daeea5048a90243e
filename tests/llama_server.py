"""Starting llama.cpp's own `llama-server` (built by scripts/llama_server.sh) on 127.0.0.1:
the pytest fixtures in conftest.py and tests/fixtures/record.py both use this."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ENV = "PHASECHAT_LLAMA_SERVER"
BUILD_HINT = (
    "Build it once (about 8 minutes on 2 cores, cached in ~/.cache/phasechat/llama.cpp) "
    f"and point {ENV} at it: {ENV}=$(scripts/llama_server.sh) .venv/bin/pytest ... "
    "(scripts/test.sh builds it and sets it)."
)
SKIP_ENV = "PHASECHAT_SKIP_SERVER_TESTS"
SKIPPED_ON_REQUEST = f"{SKIP_ENV}=1 skips the tests against llama-server"
NO_BINARY = f"no llama-server binary. {BUILD_HINT}"
# The base command's options: one slot with the whole context, 2 threads (the
# development machine's 2 cores). Extra arguments follow them; one that names an option
# here (in any spelling) replaces it, since llama-server warns about repeated options.
BASE_OPTIONS = {"--host": "127.0.0.1", "-c": "4096", "-t": "2", "--parallel": "1"}
SPELLINGS = {"--ctx-size": "-c", "--threads": "-t", "-np": "--parallel"}


def llama_server_binary() -> Path | None:
    """$PHASECHAT_LLAMA_SERVER, or None when it is unset. Set but not runnable: an error."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    path = Path(value)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeError(f"{ENV}={value} is not an executable file. {BUILD_HINT}")
    return path


def skipped_summary(reasons: list[str]) -> str | None:
    """The line a run ends with when it skipped tests against llama-server (each skip's
    reason is one of `reasons`): how many, why, and how to run them; None if it skipped none."""
    asked = sum(SKIPPED_ON_REQUEST in reason for reason in reasons)
    missing = sum(NO_BINARY in reason for reason in reasons)
    if asked:
        return (
            f"{_tests(asked)} against llama-server skipped: {SKIP_ENV}=1 is set; "
            "without it scripts/test.sh runs every test"
        )
    if missing:
        return (
            f"{_tests(missing)} against llama-server skipped: no binary in {ENV}; "
            "scripts/test.sh builds one once and runs every test"
        )
    return None


def _tests(n: int) -> str:
    return f"{n} test" if n == 1 else f"{n} tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(binary: Path, model: Path, port: int, extra_args: tuple[str, ...] = ()) -> list[str]:
    """`llama-server -m MODEL --host 127.0.0.1 -c 4096 -t 2 --parallel 1 --port PORT`,
    then `extra_args` (their own values for -c, -t, --parallel or --host win)."""
    overridden = {SPELLINGS.get(arg, arg) for arg in extra_args}
    base = [x for k, v in BASE_OPTIONS.items() if k not in overridden for x in (k, v)]
    return [str(binary), "-m", str(model), *base, "--port", str(port), *extra_args]


@dataclass
class LlamaServer:
    proc: subprocess.Popen[bytes]
    base_url: str  # ending in /v1
    log: Path

    @classmethod
    def start(
        cls,
        binary: Path,
        model: Path,
        extra_args: tuple[str, ...] = (),
        log: Path | None = None,
        limit_s: float = 120,
    ) -> LlamaServer:
        """Run it and wait until /health answers 200 (the model is loaded)."""
        port = free_port()
        log = log or Path(os.devnull)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command(binary, model, port, extra_args), stdout=out, stderr=subprocess.STDOUT
            )
        root = f"http://127.0.0.1:{port}"
        server = cls(proc, f"{root}/v1", log)
        deadline = time.monotonic() + limit_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {proc.returncode}: {server.log_tail()}"
                )
            try:
                if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"llama-server not healthy in {limit_s} s: {server.log_tail()}")
            time.sleep(0.1)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
