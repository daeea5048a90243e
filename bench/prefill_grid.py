"""The prefill's cost by batch size and depth, on the bundled model: what the edit
forecast's model of a prefill (telemetry/forecast.py) rests on.

Each cell is one read of `n` new tokens after `depth` cached ones (the median of
`--reps`), timed around `Llama.eval` on a context like the local backend's (n_batch 512,
flash attention on). Printed: ms per read, ms per new token, and the extra cost per new
token per cached token against the same read at depth 0 (attention to the cache), so
that short turns late in a chat can be compared with one long read from nothing.

Run alone (llama.cpp's threads spin-wait: a busy neighbour slows every figure):
    .venv/bin/python -m bench.prefill_grid [--threads 2] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from phasechat.backends.local.llama_logs import quiet_llama
from phasechat.backends.local.models import default_model_path

SIZES = (4, 12, 24, 32, 64, 128, 256, 512, 615)
DEPTHS = (0, 128, 512)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    quiet_llama()
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(default_model_path()),
        n_ctx=2048,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=True,
        verbose=False,
    )
    # any text gives tokens; the repository's README is long enough and always here
    readme = Path(__file__).resolve().parent.parent / "README.md"
    tokens = llm.tokenize(readme.read_text(encoding="utf-8").encode())
    need = max(DEPTHS) + max(SIZES)
    tokens = (tokens * (need // len(tokens) + 1))[:need]
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    ms: dict[tuple[int, int], float] = {}
    for depth in DEPTHS:
        for n in SIZES:
            times = []
            for _ in range(args.reps):
                llm.reset()  # the next eval reuses nothing: the depth is read anew
                if depth:
                    llm.eval(tokens[:depth])
                t0 = time.perf_counter()
                llm.eval(tokens[depth : depth + n])
                times.append((time.perf_counter() - t0) * 1000)
            ms[n, depth] = statistics.median(times)
    print("| new | depth | ms | ms a token | µs a token per cached token |")
    print("|---:|---:|---:|---:|---:|")
    for (n, depth), t in ms.items():
        extra = "" if not depth else f"{(t - ms[n, 0]) / n / depth * 1000:.2f}"
        print(f"| {n} | {depth} | {t:.1f} | {t / n:.2f} | {extra} |")
    within = (ms[max(SIZES), 0] / max(SIZES) - ms[32, 0] / 32) / (max(SIZES) / 2) * 1000
    print(
        f"\nattention among the new tokens of one {max(SIZES)}-token read: {within:.2f} µs a"
        " token per token before it (against the 32-token read's cost a token)"
    )
    print(f"load after: {os.getloadavg()[0]:.2f}")
    llm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
