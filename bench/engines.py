"""The same three prompts on the three engines, each figure beside the engine's own.

Short, long, and the long one again (its prefix cached) through the bundled model
(llama-cpp-python: llama.cpp's counters), llama.cpp's llama-server (its `timings`) and a
real vLLM (its `/metrics`, read before and after each request): prompt, cached and
evaluated tokens, decode and prefill rates, ours / the engine's. One request at a time.

Run alone on a quiet machine (it prints the load before and after):
    .venv/bin/python -m bench.engines [--llama-server PATH] [--vllm DIR]
(defaults: $PHASECHAT_LLAMA_SERVER, $PHASECHAT_VLLM; an engine without one is skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from phasechat.backends.base import Backend
from phasechat.backends.events import GenerationRequest, Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.telemetry.recorder import Trace, record
from tests.llama_server import LlamaServer
from tests.vllm_server import MODEL, VllmServer

LONG = "Summarise this log: " + " ".join(
    f"At {h:02d}:00 the keeper noted wind from the west and a calm sea." for h in range(40)
)
PROMPTS = [
    ("short", "Name three colours."),
    ("long", LONG),
    ("long again", LONG),
]
MAX_TOKENS = 48


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} cores"


def pair(ours: float | None, engine: float | None, digits: int = 0) -> str:
    def n(v: float | None) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"

    return f"{n(ours)} / {n(engine)}"


def row(engine: str, label: str, m: Metrics) -> str:
    evaluated = m.server_prompt_n
    cached = m.server_cache_n
    prompt = evaluated + (cached or 0) if evaluated is not None else None
    return (
        f"| {engine} | {label} | {pair(m.prompt_tokens, prompt)} | "
        f"{pair(m.cached_tokens, cached)} | {pair(m.evaluated_prompt_tokens, evaluated)} | "
        f"{pair(m.decode_tok_s, m.server_decode_tok_s, 1)} | "
        f"{pair(m.prefill_tok_s, m.server_prefill_tok_s, 1)} | {m.server_source or '-'} |"
    )


async def run(backend: Backend, engine: str) -> list[str]:
    await backend.start()
    out = []
    try:
        warm = GenerationRequest((Message("user", "Hi"),), max_tokens=4, temperature=0)
        async for _ in backend.stream(warm):  # the first request after a start warms up
            pass
        for label, prompt in PROMPTS:
            request = GenerationRequest(
                (Message("user", prompt),), max_tokens=MAX_TOKENS, temperature=0, seed=42
            )
            trace = Trace(backend.name, backend.model, window=backend.context_window)
            async for _ in record(backend.stream(request), trace):
                pass
            out.append(row(engine, label, compute(trace)))
    finally:
        await backend.aclose()
    return out


async def main(args: argparse.Namespace) -> None:
    model = default_model_path()
    print(f"# bench.engines · {model.name} · max_tokens {MAX_TOKENS} · before: {load()}")
    print("| engine | prompt | prompt tokens | cached | evaluated | decode tok/s | "
          "prefill tok/s | the engine's account |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for line in await run(LocalBackend(LocalConfig(model_path=model, n_ctx=4096)), "local"):
        print(line)
    binary = args.llama_server or os.environ.get("PHASECHAT_LLAMA_SERVER")
    if binary:
        server = LlamaServer.start(Path(binary), model)
        try:
            remote = RemoteBackend(RemoteConfig(base_url=server.base_url, name="llama-server"))
            for line in await run(remote, "llama-server"):
                print(line)
        finally:
            server.stop()
    home = args.vllm or os.environ.get("PHASECHAT_VLLM")
    if home:
        vllm = VllmServer.start(Path(home), ("--enable-prompt-tokens-details",))
        try:
            config = RemoteConfig(base_url=vllm.base_url, model=MODEL, name="vllm")
            for line in await run(RemoteBackend(config), "vLLM"):
                print(line)
        finally:
            vllm.stop()
    print(f"# after: {load()} · each cell: ours / the engine's own")


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__.split("\n")[0])
    p.add_argument("--llama-server", default=None, help="a llama-server binary")
    p.add_argument("--vllm", default=None, help="scripts/vllm_tool.sh's folder")
    asyncio.run(main(p.parse_args()))
