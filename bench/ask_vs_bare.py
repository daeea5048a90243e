"""Decode rate through `phasechat ask` vs a bare llama-cpp-python streaming loop.

Same model, prompt, threads and greedy sampling, interleaved in one run. Both rates are
tokens after the first / time from first to last token; the bare loop is
`Llama.create_chat_completion(stream=True)` timed chunk by chunk (one token per chunk).

    .venv/bin/python -m bench.ask_vs_bare [--rounds 3] [--tokens 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from phasechat.backends.local.models import default_model_path

SYSTEM = "You are a storyteller."
PROMPT = "Write a long, detailed story about a lighthouse keeper and the sea."


def bare_rate(tokens: int, threads: int) -> float:
    """A fresh process, so both arms pay the same load and warm-up."""
    code = f"""
import time, llama_cpp
llm = llama_cpp.Llama({str(default_model_path())!r}, n_ctx=2048, n_threads={threads},
                      n_threads_batch={threads}, verbose=False)
msgs = [{{"role": "system", "content": {SYSTEM!r}}}, {{"role": "user", "content": {PROMPT!r}}}]
llm.create_chat_completion(msgs, max_tokens=4, temperature=0)  # warm-up, as phasechat does
times = []
for chunk in llm.create_chat_completion(msgs, max_tokens={tokens}, temperature=0, stream=True):
    if chunk["choices"][0]["delta"].get("content"):
        times.append(time.perf_counter())
print((len(times) - 1) / (times[-1] - times[0]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def ask_rate(tokens: int, threads: int) -> float:
    cmd = [sys.executable, "-m", "phasechat", "ask", "--json", "--no-save", "--threads",
           str(threads), "--n-ctx", "2048", "--max-tokens", str(tokens), "--temperature", "0",
           "--system", SYSTEM, PROMPT]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["decode_tok_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    bare: list[float] = []
    ours: list[float] = []
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        bare.append(bare_rate(args.tokens, args.threads))
        ours.append(ask_rate(args.tokens, args.threads))
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"threads {args.threads}, {args.tokens} tokens, {args.rounds} rounds interleaved "
          f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    print(f"bare llama-cpp-python stream  median {b:.1f} tok/s  {[round(x, 1) for x in bare]}")
    print(f"phasechat ask                 median {o:.1f} tok/s  {[round(x, 1) for x in ours]}")
    print(f"phasechat / bare              {o / b:.3f}")


if __name__ == "__main__":
    main()
