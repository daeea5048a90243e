"""The decode window's end, before and after: vLLM answers that end in their
end-of-sequence token, each measured two ways from the same trace.

Before: the window ends at the last chunk with text. After: at the `finish_reason: "stop"`
chunk that stands for the end-of-sequence token the server counted (`Finished.t_silent_ns`).
Both beside vLLM's own decode rate for the same request (its `/metrics`).

    PHASECHAT_VLLM=$(scripts/vllm_tool.sh) .venv/bin/python -m bench.eos_window

Run alone on a quiet machine; it prints the load before and after.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from phasechat.backends.events import GenerationRequest, Message
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record
from tests.vllm_server import MODEL, VllmServer

PROMPTS = (
    "Hi",
    "Write a haiku about the sea.",
    "Write one sentence about cats.",
    "Give me three tips for sleeping well.",
)


async def main() -> None:
    print(f"# bench.eos_window · load {os.getloadavg()[0]:.2f} before")
    print("| answer | finish | tokens | before | after | vLLM's own | before/own | after/own |")
    print("|---|---|---|---|---|---|---|---|")
    server = VllmServer.start(Path(os.environ["PHASECHAT_VLLM"]))
    try:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model=MODEL))
        await backend.start()
        for prompt in PROMPTS:
            trace = Trace("openai", MODEL)
            request = GenerationRequest(
                (Message("user", prompt),), max_tokens=200, temperature=0, seed=42
            )
            async for _ in record(backend.stream(request), trace):
                pass
            after = compute(trace)
            trace.t_silent_token = None  # the window as it was: to the last text
            before = compute(trace)
            own = after.server_decode_tok_s
            if before.decode_tok_s is None or after.decode_tok_s is None or not own:
                print(f"| {prompt} | {after.finish} | no decode rate |")
                continue
            print(
                f"| {prompt} | {after.finish} | {after.output_tokens} | "
                f"{before.decode_tok_s:.2f} | {after.decode_tok_s:.2f} | {own:.2f} | "
                f"{before.decode_tok_s / own:.3f} | {after.decode_tok_s / own:.3f} |"
            )
        await backend.aclose()
    finally:
        server.stop()
    print(f"# load {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    asyncio.run(main())
