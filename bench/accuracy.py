"""Does phasechat's meter agree with the engine's own account? Printed side by side, one run.

For the same requests, cold then warm (a follow-up that reuses the cached prefix), on the
bundled model through llama-cpp-python and on a real llama-server: prompt / cached /
evaluated tokens (ours vs the engine's), decode rate (ours / the engine's), and TTFT minus
the engine's own prompt time (the transport's and the client's share). Then the same
prompt in the TUI (under Textual's `run_test`) and headless: ITL p50 / p99.

Run alone on a quiet machine: .venv/bin/python -m bench.accuracy [--llama-server PATH]
(default: $PHASECHAT_LLAMA_SERVER). Prints the machine's load beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from phasechat.backends.base import Backend
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.metrics import Metrics

PROMPTS = [
    "Summarise: " + "The sea was calm and the light turned slowly over the bay. " * 10,
    "Now say it in one sentence.",
]
SETTINGS = Settings(max_tokens=96, temperature=0)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} cores"


def row(label: str, m: Metrics) -> str:
    ours = f"{m.prompt_tokens}/{m.cached_tokens}/{m.evaluated_prompt_tokens}"
    engine = f"{(m.server_prompt_n or 0) + (m.server_cache_n or 0)}/{m.server_cache_n}/"
    engine += f"{m.server_prompt_n}"
    ratio = (
        m.decode_tok_s / m.server_decode_tok_s
        if m.decode_tok_s and m.server_decode_tok_s
        else float("nan")
    )
    transport = (m.ttft_ms or 0) - (m.server_prompt_ms or 0)
    return (
        f"{label:<22} {ours:>13} {engine:>13}  {m.decode_tok_s or 0:7.1f} "
        f"{m.server_decode_tok_s or 0:7.1f} {ratio:6.3f}  {transport:7.1f}  "
        f"{len(m.warnings)}"
    )


async def cold_then_warm(backend: Backend, name: str) -> list[str]:
    turns = TurnController(backend, SETTINGS)
    out = []
    for label, prompt in zip(("cold", "warm"), PROMPTS, strict=True):
        await turns.send(prompt)
        m = turns.exchanges[-1].metrics
        assert m is not None
        out.append(row(f"{name} {label}", m))
    return out


@contextlib.contextmanager
def llama_server(binary: str, model: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-c", "4096", "-t", "2", "--parallel", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


async def tui_vs_headless(backend: LocalBackend) -> list[str]:
    from phasechat.tui.app import PhasechatApp

    prompt = "Write a short story about a lighthouse keeper."
    settings = Settings(max_tokens=200, temperature=0)
    headless = TurnController(backend, settings)
    await headless.send(prompt)
    app = PhasechatApp(settings=settings, backend=backend)
    async with app.run_test() as pilot:
        assert app.chat.send(prompt)
        while not app.turns.exchanges or app.chat.generating:
            await pilot.pause(0.05)
        tui = app.turns.exchanges[-1].metrics
    head = headless.exchanges[-1].metrics
    assert tui is not None and head is not None
    return [
        f"{'where':<10} {'ITL p50':>8} {'ITL p99':>8} {'decode':>8} {'engine':>8}",
        f"{'headless':<10} {head.itl_ms_p50 or 0:8.2f} {head.itl_ms_p99 or 0:8.2f} "
        f"{head.decode_tok_s or 0:8.1f} {head.server_decode_tok_s or 0:8.1f}",
        f"{'TUI':<10} {tui.itl_ms_p50 or 0:8.2f} {tui.itl_ms_p99 or 0:8.2f} "
        f"{tui.decode_tok_s or 0:8.1f} {tui.server_decode_tok_s or 0:8.1f}",
        f"TUI / headless: p50 {(tui.itl_ms_p50 or 0) / (head.itl_ms_p50 or 1):.3f}, "
        f"p99 {(tui.itl_ms_p99 or 0) / (head.itl_ms_p99 or 1):.3f}",
    ]


async def main(args: argparse.Namespace) -> None:
    model = default_model_path()
    print(f"# bench.accuracy · {model.name} · {load()}")
    print(f"{'request':<22} {'ours p/c/e':>13} {'engine p/c/e':>13}  {'decode':>7} "
          f"{'engine':>7} {'ratio':>6}  {'ttft-':>7}  warn")  # fmt: skip
    print(f"{'':<22} {'':>13} {'':>13}  {'tok/s':>7} {'tok/s':>7} {'':>6}  {'prompt_ms':>7}")
    local = LocalBackend(LocalConfig(model_path=model, n_ctx=4096, threads=args.threads))
    await local.start()
    try:
        for line in await cold_then_warm(local, "local"):
            print(line)
        binary = args.llama_server or os.environ.get("PHASECHAT_LLAMA_SERVER")
        if binary:
            with llama_server(binary, model) as base:
                remote = RemoteBackend(RemoteConfig(base_url=base))
                await remote.start()
                for line in await cold_then_warm(remote, "llama-server"):
                    print(line)
                await remote.aclose()
        else:
            print("llama-server: skipped (no --llama-server and no $PHASECHAT_LLAMA_SERVER)")
        print()
        for line in await tui_vs_headless(local):
            print(line)
    finally:
        await local.aclose()
    print(f"# after: {load()}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--llama-server", default=None, help="a llama-server binary")
    p.add_argument("--threads", type=int, default=None)
    asyncio.run(main(p.parse_args()))
