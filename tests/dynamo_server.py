"""Starting a real NVIDIA Dynamo (ai-dynamo from PyPI, set up by scripts/dynamo_tool.sh) on
127.0.0.1: its frontend (the OpenAI-compatible HTTP server and the KV router) and one mocker
worker (Dynamo's own engine stand-in: it schedules, caches prefixes in blocks and times a
request like an engine, with the bundled SmolLM2's tokenizer and no model or GPU). The
pytest fixture `dynamo` in conftest.py uses this.

The commands (issue 46 found them by trying): `python -m dynamo.frontend --http-host
127.0.0.1 --http-port P --router-mode kv` and `python -m dynamo.mocker --model-path M
--model-name smol --enable-prefix-caching`, both with `--discovery-backend file
--request-plane tcp --event-plane zmq` and `DYN_FILE_KV=DIR` (they find each other through
files in DIR: no etcd, no NATS). Up in about 10 s. The request and event planes are bound
to 127.0.0.1 (`DYN_TCP_RPC_HOST`, ...): left alone they advertise the machine's own address.
Each runs in a process group of its own, stopped with SIGTERM to the group.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.llama_server import SKIP_ENV, free_port
from tests.process_group import spawn, stop

ENV = "PHASECHAT_DYNAMO"
BUILD_HINT = (
    "Set it up once (about a minute, cached in ~/.cache/phasechat/dynamo; it needs "
    f"scripts/vllm_tool.sh's model folder) and point {ENV} at its python: "
    f"{ENV}=$(scripts/dynamo_tool.sh) .venv/bin/pytest ... (scripts/test.sh sets it up)."
)
SKIPPED_ON_REQUEST = f"{SKIP_ENV}=1 and no Dynamo set up in {ENV}"
#: the name the mocker serves the model as
MODEL = "smol"
#: the KV block the mocker caches prefixes in and the router counts hits in (tokens):
#: smaller than its default 64 so that a short chat's second turn can hit whole blocks
BLOCK_SIZE = 16
PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")
LOOPBACK = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def dynamo_python() -> Path | None:
    """$PHASECHAT_DYNAMO (the python of scripts/dynamo_tool.sh's venv), or None when it is
    unset. Set but not a finished set-up: an error."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    python = Path(value)
    if not (python.is_file() and (model_folder(python) / "config.json").is_file()):
        raise RuntimeError(f"{ENV}={value} is not a finished Dynamo set-up. {BUILD_HINT}")
    return python


def skipped_line(reasons: list[str]) -> str | None:
    """The line a run ends with when it skipped tests against Dynamo (None: it skipped
    none): only a quick edit loop without a set-up skips them."""
    n = sum(SKIPPED_ON_REQUEST in reason for reason in reasons)
    if not n:
        return None
    return (
        f"{n} test{'s' * (n != 1)} against Dynamo skipped: {SKIPPED_ON_REQUEST}; "
        "scripts/test.sh sets it up and runs them"
    )


def model_folder(python: Path) -> Path:
    """The model folder scripts/dynamo_tool.sh keeps beside its venv."""
    return python.parent.parent.parent / "model"


@dataclass
class DynamoServer:
    procs: list[subprocess.Popen[bytes]]  # the frontend, the mocker
    base_url: str  # ending in /v1
    logs: tuple[Path, Path]

    @classmethod
    def start(cls, python: Path, logs: Path, limit_s: float = 120) -> DynamoServer:
        """Run the frontend and one mocker, and wait until the frontend lists the model
        (the worker registered)."""
        port = free_port()
        env = {**os.environ, **LOOPBACK, "DYN_FILE_KV": str(logs / "discovery")}
        frontend = [
            str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
            "--http-port", str(port), "--router-mode", "kv", *PLANES,
        ]  # fmt: skip
        mocker = [
            str(python), "-m", "dynamo.mocker", "--model-path", str(model_folder(python)),
            "--model-name", MODEL, "--enable-prefix-caching",
            "--block-size", str(BLOCK_SIZE), *PLANES,
        ]  # fmt: skip
        paths = (logs / "frontend.log", logs / "mocker.log")
        procs = [spawn(argv, log, env) for argv, log in zip((frontend, mocker), paths, strict=True)]
        server = cls(procs, f"http://127.0.0.1:{port}/v1", paths)
        deadline = time.monotonic() + limit_s
        while True:
            for proc in procs:
                if proc.poll() is not None:
                    server.stop()
                    raise RuntimeError(f"Dynamo exited with {proc.returncode}: {server.tail()}")
            try:
                listing = httpx.get(f"{server.base_url}/models", timeout=1)
                if any(m.get("id") == MODEL for m in listing.json().get("data", [])):
                    return server
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"Dynamo not up in {limit_s} s: {server.tail()}")
            time.sleep(0.5)

    def tail(self) -> str:
        out = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                out.append(f"{log.name}: {log.read_text(errors='replace')[-2000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
