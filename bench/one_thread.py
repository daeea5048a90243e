"""Decode on the process's one llama thread vs on a second thread, in one run.

Run: .venv/bin/python -m bench.one_thread [--rounds 4] [--tokens 128]

With an OpenMP build, ggml's workers belong to the thread that starts a decode, and
every op ends at an OpenMP barrier. Once a second thread has decoded, libgomp manages
more threads than there are cores and its barriers sleep instead of spinning. Before
`llama_glue.llama_thread`, every LocalBackend had its own llama thread, so a second
local model (compare, a switch, bench.contention's three configurations) halved decode
for all of them. This loads the bundled model as phasechat does and times the same
greedy decode, interleaved: on the llama thread, then on a fresh second thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time

from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.llama_glue import llama_thread, physical_cores, token_loop

PROMPT = "Write a long story about a dragon who learns to fly."


async def run(rounds: int, tokens: int) -> None:
    backend = LocalBackend(LocalConfig(threads=physical_cores()))
    await backend.start()
    prompt, _ = backend.format_prompt((Message("user", PROMPT),))
    llm = backend._llm

    def rate() -> float:
        llm.reset()
        stamps: list[int] = []
        gen = token_loop(llm, prompt, 0.0, lambda c, e: None, lambda d: None)
        for _ in gen:
            stamps.append(time.perf_counter_ns())
            if len(stamps) > tokens:
                break
        gen.close()
        return tokens * 1e9 / (stamps[-1] - stamps[0])

    def on_second_thread() -> float:
        box: list[float] = []
        t = threading.Thread(target=lambda: box.append(rate()))
        t.start()
        t.join()
        return box[0]

    loop = asyncio.get_running_loop()
    one: list[float] = []
    two: list[float] = []
    for r in range(rounds):
        one.append(await loop.run_in_executor(llama_thread(), rate))
        two.append(on_second_thread())
        print(f"round {r + 1}: llama thread {one[-1]:6.1f}  second thread {two[-1]:6.1f} "
              f"tok/s  load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    await backend.aclose()
    a, b = statistics.median(one), statistics.median(two)
    print(f"\n{physical_cores()} threads, {tokens} tokens, medians: llama thread {a:.1f}, "
          f"second thread {b:.1f} tok/s; second / llama thread {b / a:.2f}")  # fmt: skip


def main() -> None:
    """Parse arguments and run."""
    p = argparse.ArgumentParser(prog="python -m bench.one_thread", description=__doc__)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    asyncio.run(run(args.rounds, args.tokens))


if __name__ == "__main__":
    main()
