"""`phasechat ask` decode against llama-bench's best configuration, in one run.

Run: .venv/bin/python -m bench.speed [--rounds 3] [--reps 2] [--threads N]

Issue 13, item 1: `ask` decode >= 0.95 x llama-bench's best configuration (flash
attention on or off, whichever is faster here) on the same model and threads. In
interleaved rounds (each: llama-bench tg128 with `-fa 0,1`, then `phasechat ask --json`
as a user runs it, a fresh process each time, default flags and `--threads N`), it
prints best and median tok/s of each, the ratios to llama-bench's faster flash-attention
setting, llama-bench off vs on, the flash attention phasechat chose (backends/flash.py)
and the load average beside each round. `ask`'s rate is its telemetry's
`decode_tok_s`: (tokens - 1) / first-to-last token, 128 tokens after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.engine import find_llama_bench, restore_symlinks
from phasechat.backends.flash import cached
from phasechat.backends.llama_glue import physical_cores
from phasechat.backends.models import default_model_path

PROMPT = "Write a long story about a dragon who learns to fly."
TOKENS = 128


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min)"


def llama_bench(binary: Path, model: Path, threads: int, reps: int) -> dict[bool, list[float]]:
    """tg128 samples, tok/s, by flash attention."""
    restore_symlinks(binary)
    cmd = [
        str(binary),
        *("-m", str(model), "-t", str(threads), "-r", str(reps)),
        *("-p", "0", "-n", str(TOKENS), "-fa", "0,1", "-o", "json"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows: dict[bool, list[float]] = {False: [], True: []}
    for row in json.loads(out):
        rows[bool(row["flash_attn"])] += row.get("samples_ts") or [row["avg_ts"]]
    return rows


def ask(extra: list[str]) -> dict[str, object]:
    """One `phasechat ask --json` in a fresh process: its metrics."""
    cmd = [
        str(Path(sys.executable).parent / "phasechat"),
        *("ask", "--json", "--no-save", "--temperature", "0"),
        *("--max-tokens", str(TOKENS + 1), *extra, PROMPT),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    data: dict[str, object] = json.loads(out)
    return data


def row(label: str, xs: list[float], ref: float | None) -> str:
    med = statistics.median(xs)
    ratio = f"{max(xs) / ref:8.3f}" if ref else ""
    return f"{label:<34}{max(xs):8.1f}{med:8.1f}{ratio}"


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the table."""
    p = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=2, help="per side per round")
    p.add_argument("--threads", type=int, help="default: physical cores")
    p.add_argument("--llama-bench", help="path to the llama-bench binary")
    args = p.parse_args(argv)
    model = default_model_path()
    threads = args.threads or physical_cores()
    binary = find_llama_bench(args.llama_bench)
    if binary is None or not binary.is_file():
        print("llama-bench not found: scripts/llama_tool.sh llama-bench (bench/README.md)")
        return 1
    print(f"{model.name} · {threads} threads · {args.rounds} rounds x {args.reps} reps · {load()}")
    ref: dict[bool, list[float]] = {False: [], True: []}
    ours: dict[str, list[float]] = {"default": [], "fixed": []}
    threads_seen: list[str] = []
    for r in range(args.rounds):
        print(f"round {r + 1}: {load()}", flush=True)
        for fa, samples in llama_bench(binary, model, threads, args.reps).items():
            ref[fa] += samples
        for _ in range(args.reps):
            for key, extra in (("default", []), ("fixed", ["--threads", str(threads)])):
                m = ask(extra)
                ours[key].append(float(m["decode_tok_s"]))  # type: ignore[arg-type]
                if key == "default":
                    threads_seen.append(f"{m['threads']} ({m['threads_reason']})")
    fa_best = statistics.median(ref[True]) >= statistics.median(ref[False])
    best = max(ref[fa_best])
    choice = cached(model, threads)
    head = f"decode tok/s, tg{TOKENS}"
    print(f"\n{head:<34}{'best':>8}{'median':>8}{'best/llama-bench best':>24}")
    print(row("llama-bench fa off", ref[False], best))
    print(row("llama-bench fa on", ref[True], best))
    print(row("phasechat ask (default)", ours["default"], best))
    print(row(f"phasechat ask --threads {threads}", ours["fixed"], best))
    off_on = statistics.median(ref[False]) / statistics.median(ref[True])
    better = "on" if fa_best else "off"
    print(f"\nllama-bench fa off / on (medians): {off_on:.3f}; its best here: fa {better}")
    med = statistics.median(ours["default"]) / statistics.median(ref[fa_best])
    print(f"ask (default) / llama-bench best, medians: {med:.3f} (goal >= 0.95)")
    print(f"phasechat: {choice.summary if choice else 'flash attention not measured yet'}")
    print(f"ask (default) ended on threads: {sorted(set(threads_seen))}")
    print(f"{load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
