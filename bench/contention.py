"""Local decode beside one busy neighbour process, against the same decode quiet.

Run: .venv/bin/python -m bench.contention [--rounds 3] [--tokens 256] [--skip-llama-bench]

Issue 13, item 3: with one competing CPU-bound process (`python3 -c 'while True: pass'`),
local decode should keep >= 0.75 of its quiet rate, with no flag. In one run, in
interleaved rounds (each round: quiet, then with the neighbour), it measures:

- phasechat's `LocalBackend` with `--threads` fixed at all physical cores, fixed at one
  fewer, and the default (adaptive: backends/local/threads.py), each answer's decode rate as
  its telemetry computes it ((tokens - 1) / first-to-last token), temperature 0;
- llama-bench tg at all cores and one fewer, flash attention as phasechat loads it;

and prints, per configuration, best and median tok/s quiet and busy, and busy / quiet
(medians), with the load average at each step. "Quiet" is only as quiet as the machine:
the load printed beside each round says how much else was running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from bench.engine import find_llama_bench, measure, restore_symlinks
from phasechat.backends.events import GenerationRequest, Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.llama_glue import physical_cores
from phasechat.backends.local.models import default_model_path

PROMPT = "Write a long story about a dragon who learns to fly."
BUSY = "while True: pass"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min)"


class Neighbour:
    """One CPU-bound process for the length of a `with` block (or none, when quiet)."""

    def __init__(self, busy: bool) -> None:
        self.busy = busy
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Neighbour:
        if self.busy:
            self.proc = subprocess.Popen([sys.executable, "-c", BUSY])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def llama_bench_tg(
    binary: Path, model: Path, threads: list[int], fa: bool, n: int
) -> dict[int, float]:
    """llama-bench tg`n` tok/s per thread count (one rep each)."""
    import json

    restore_symlinks(binary)
    cmd = [
        str(binary),
        *("-m", str(model), "-t", ",".join(map(str, threads)), "-r", "1"),
        *("-p", "0", "-n", str(n), "-fa", "1" if fa else "0", "-o", "json"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {int(row["n_threads"]): float(row["avg_ts"]) for row in json.loads(out)}


async def run(args: argparse.Namespace) -> int:
    model = Path(args.model) if args.model else default_model_path()
    cores = physical_cores()
    fewer = max(1, cores - 1)
    binary = None if args.skip_llama_bench else find_llama_bench(args.llama_bench)
    if binary is not None and not binary.is_file():
        binary = None
    configs = {
        f"fixed {cores} threads": LocalConfig(model_path=model, threads=cores),
        f"fixed {fewer} thread{'s' if fewer > 1 else ''}": LocalConfig(
            model_path=model, threads=fewer
        ),
        "adaptive (default)": LocalConfig(model_path=model),
    }
    backends = {name: LocalBackend(cfg) for name, cfg in configs.items()}
    for backend in backends.values():
        await backend.start()
        if backend.state != "ready":
            print(f"backend failed: {backend.state_detail}")
            return 1
    some = next(iter(backends.values()))
    fa = int(some._llm.context_params.flash_attn_type) == 1
    print(f"{model.name} · {cores} physical cores · {args.rounds} rounds · {args.tokens} tokens")
    print(f"flash attention {'on' if fa else 'off'} · {load()}")
    request = GenerationRequest((Message("user", PROMPT),), args.tokens + 1, temperature=0)
    for backend in backends.values():  # settle: first-request costs, and the policy
        await measure(backend, GenerationRequest((Message("user", "Hi"),), 8, 0.0))
    rates: dict[tuple[str, bool], list[float]] = defaultdict(list)
    notes: dict[str, list[str]] = defaultdict(list)
    for r in range(args.rounds):
        for busy in (False, True):
            with Neighbour(busy):
                await asyncio.sleep(0.3)
                print(f"round {r + 1} {'busy ' if busy else 'quiet'}: {load()}", flush=True)
                for name, backend in backends.items():
                    m = await measure(backend, request)
                    assert m.decode_tok_s is not None, m
                    rates[name, busy].append(m.decode_tok_s)
                    if m.thread_changes:
                        notes[name].append(
                            f"{'busy' if busy else 'quiet'}: {m.thread_changes} changes, "
                            f"ended on {m.threads} ({m.threads_reason})"
                        )
                if binary is not None:
                    tg = llama_bench_tg(binary, model, sorted({cores, fewer}), fa, 128)
                    for t, rate in tg.items():
                        rates[f"llama-bench -t {t}", busy].append(rate)
    for backend in backends.values():
        await backend.aclose()

    print(f"\n{'decode tok/s':<24}{'quiet':>16}{'1 busy neighbour':>20}{'busy/quiet':>12}")
    print(f"{'':<24}{'best':>8}{'median':>8}{'best':>10}{'median':>10}{'(median)':>12}")
    names = list(dict.fromkeys(name for name, _ in rates))
    quiet_default = statistics.median(rates["adaptive (default)", False])
    for name in names:
        q, b = rates[name, False], rates[name, True]
        ratio = statistics.median(b) / statistics.median(q)
        print(
            f"{name:<24}{max(q):8.1f}{statistics.median(q):8.1f}"
            f"{max(b):10.1f}{statistics.median(b):10.1f}{ratio:12.2f}"
        )
    best_quiet = max(statistics.median(rates[n, False]) for n in names if n.startswith("fixed"))
    print(
        f"\nadaptive, quiet / best fixed count quiet: {quiet_default / best_quiet:.2f}"
        f"\nadaptive, busy / its quiet: "
        f"{statistics.median(rates['adaptive (default)', True]) / quiet_default:.2f} (goal >= 0.75)"
    )
    for name, lines in notes.items():
        print(f"\n{name}: thread changes")
        for line in lines:
            print(f"  {line}")
    print(f"\n{load()} at the end")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the rounds, print the table."""
    p = argparse.ArgumentParser(
        prog="python -m bench.contention", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", help="GGUF path (default: the bundled SmolLM2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved quiet/busy rounds")
    p.add_argument("--tokens", type=int, default=256, help="tokens per answer")
    p.add_argument("--llama-bench", help="path to the llama-bench binary")
    p.add_argument("--skip-llama-bench", action="store_true", help="phasechat figures only")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
