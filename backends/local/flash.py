"""Flash attention on or off: whichever decodes faster here, measured once and cached.

llama.cpp's own default ("auto") turns flash attention on wherever the device supports
it, which is always on a CPU; llama-cpp-python 0.3.36 can only say on or off. Which one
decodes faster depends on the CPU and the model: on an Intel Xeon, llama-bench's tg128
for SmolLM2-135M was 160.7 tok/s off and 151.5 on (issue 13); on another run, on was
faster (bench/README.md). So we measure: the first load of a model with a given build
and thread count decodes a few tokens each way, interleaved (two small contexts on the
same weights), and keeps flash attention on unless off is at least `MARGIN` faster, overall
and in most rounds (on is what llama.cpp would choose). The answer is cached on disk,
keyed by the model file (path, size, mtime), the llama.cpp build and the thread count,
so later loads pay nothing. With layers on a GPU it is on, as llama.cpp's "auto" does,
and said to be unmeasured: the measurement here runs on the CPU.

A measurement is only as good as the machine was quiet: one taken beside a compiler
chose off (on 62 ms, off 49 ms a step) where a quiet machine runs on 19% faster. So the
other processes' share of the CPUs is noted (backends/local/measured.py); a busy measurement
serves this run only and is never kept, and an answer that decodes far faster than the
kept figure marks it stale (`recheck`). The file is checked when read
(backends/local/flash_cache.py): a damaged entry is ignored and measured again, with a notice.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phasechat.backends.local import flash_cache
from phasechat.backends.local.flash_cache import STAMP, FlashChoice, cache_file
from phasechat.backends.local.llama_logs import quiet_llama, verbose
from phasechat.backends.local.measured import busy, others_during
from phasechat.backends.local.threads import CpuShare

__all__ = ["FlashChoice", "cache_file"]

#: off must decode this much faster than on to be chosen
MARGIN = 0.03
ROUNDS = 4
STEPS = 16
#: the steps stop after this much time in all (`measure`), ...
BUDGET_MS = 3000.0
#: ... once each side has this many
MIN_EACH = 4
#: an answer that decodes this many times faster than the kept step time for the same
#: setting says that the measurement was slowed (a compiler beside it took 49 ms a step
#: where a quiet machine takes 11.5): the entry is marked stale and measured again at
#: the next load. A slower answer says nothing: a neighbour or a long context explains it.
DISAGREE = 1.5
#: decode steps an answer needs before its rate is compared with the kept one
MIN_STEPS = 16


@dataclass(frozen=True, slots=True)
class Measured:
    """What a measurement saw: median step times (ms), in how many rounds off was
    faster, and the other processes' share of the CPUs meanwhile (None: unknown)."""

    on_ms: float
    off_ms: float
    off_wins: int
    others: float | None


@dataclass(frozen=True, slots=True)
class Decision:
    """Flash attention for a load, why, the choice behind it (None: set, or a GPU), and
    a notice for the user (a cache entry that was ignored)."""

    flash_attn: bool
    note: str
    choice: FlashChoice | None = None
    notice: str | None = None


def decide(setting: bool | None, gpu: bool, model: Path, threads: int) -> Decision:
    """Flash attention for a load, and why: `setting` if given, on for a GPU, else the
    measured (or cached) choice."""
    if setting is not None:
        return Decision(setting, f"flash attention {'on' if setting else 'off'} (set)")
    if gpu:
        return Decision(True, "flash attention on (GPU offload: llama.cpp's auto, not measured)")
    choice, notice = choose(model, threads)
    return Decision(choice.flash_attn, choice.summary, choice, notice)


def build_id() -> str:
    """The llama.cpp build llama-cpp-python loads: its version, CPU features and library."""
    quiet_llama()
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    stat = lib.stat() if lib.exists() else None
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    parts = [llama_cpp.__version__, info, f"{stat.st_size}:{stat.st_mtime_ns}" if stat else ""]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_key(model: Path, threads: int) -> str:
    stat = model.stat()
    return f"{model.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{build_id()}|{threads}"


def cached(model: Path, threads: int) -> FlashChoice | None:
    """The cached choice for this model, build and thread count, if one is trusted."""
    return flash_cache.read(cache_key(model, threads))[0]


def choose(
    model: Path,
    threads: int,
    measure_now: Callable[[Path, int], Measured] | None = None,
    quiet: Callable[[], bool] | None = None,
) -> tuple[FlashChoice, str | None]:
    """The cached choice, or one measured now (a second or two; kept unless the machine
    was busy), and a notice when the cache file or its entry was ignored."""
    key = cache_key(model, threads)
    found, notice = flash_cache.read(key)
    if found is not None and (not found.busy or not (quiet or quiet_now)()):
        return found, notice  # a provisional one serves while the machine stays busy
    seen = (measure_now or measure_model)(model, threads)
    choice = FlashChoice(
        flash_attn=not (seen.off_ms < seen.on_ms * (1 - MARGIN) and seen.off_wins > ROUNDS // 2),
        on_ms=seen.on_ms,
        off_ms=seen.off_ms,
        measured_at=time.strftime(STAMP, time.gmtime()),
        others=seen.others,
    )
    flash_cache.store(key, choice)
    return choice, notice


def quiet_now(share: Callable[[], CpuShare] = CpuShare) -> bool:
    """Whether other processes leave the CPUs alone now (a third of a second's look):
    the moment to measure a provisional choice again."""
    cpu = share()
    time.sleep(CpuShare.MIN_S)
    idle = cpu.idle_share()
    return idle is not None and not busy(1.0 - idle)


def recheck(
    model: Path, threads: int, choice: FlashChoice, decode_ms: float, steps: int
) -> str | None:
    """After an answer: when it decoded `DISAGREE` times faster than the kept choice's
    step time, mark the entry stale (measured again at the next load) and say so. A
    busy measurement was never kept: the next run measures again anyway."""
    if choice.busy or steps < MIN_STEPS or not decode_ms > 0 or decode_ms * DISAGREE > choice.ms:
        return None
    flash_cache.mark_stale(cache_key(model, threads))
    return (
        f"flash attention: this answer decoded at {decode_ms:.1f} ms a token, the "
        f"measurement in {cache_file()} said {choice.ms:.1f} ms; measured again at the next load"
    )


def measure_model(model: Path, threads: int) -> Measured:
    """Decode a few tokens each way on two small contexts of `model`, interleaved."""
    quiet_llama()
    import llama_cpp

    def make(flash: bool) -> Any:
        return llama_cpp.Llama(
            model_path=str(model),
            n_ctx=512,
            n_batch=64,
            n_gpu_layers=0,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash,
            verbose=verbose(),
        )

    on, off = make(True), make(False)
    try:
        (on_ms, off_ms, off_wins), others = others_during(
            lambda: measure(step_timer(on), step_timer(off))
        )
    finally:
        on.close()
        off.close()
    return Measured(on_ms, off_ms, off_wins, others)


def measure(on: Callable[[], float], off: Callable[[], float]) -> tuple[float, float, int]:
    """Median step time (ms) of each side over ROUNDS interleaved rounds of STEPS steps
    (a neighbour's burst slows both sides alike), and in how many rounds off was faster:
    a choice that a burst made is not kept for good.

    The steps stop once they have taken `BUDGET_MS` in all (with `MIN_EACH` steps a side
    at least, as many on one side as on the other): a quiet machine measures every round
    within a second, and a busy one (steps 20-30 times as long: 173 and 277 ms beside a
    test run at load 7, 49 s in all) would otherwise hold the load for a minute to
    measure what is provisional anyway. Fewer rounds than a majority never choose off."""
    times: dict[bool, list[float]] = {True: [], False: []}
    off_wins = 0
    spent = 0.0
    for _ in range(ROUNDS):
        a: list[float] = []
        for _ in range(STEPS):
            a.append(on())
            # the off side takes about as long: stop where the two would pass the budget
            if spent + 2 * sum(a) > BUDGET_MS and len(a) >= MIN_EACH:
                break
        b = [off() for _ in a]
        spent += sum(a) + sum(b)
        off_wins += statistics.median(b) < statistics.median(a)
        times[True] += a
        times[False] += b
        # another round of the fewest steps, at these speeds, would pass the budget
        if spent + MIN_EACH * (statistics.median(a) + statistics.median(b)) > BUDGET_MS:
            break
    return statistics.median(times[True]), statistics.median(times[False]), off_wins


def step_timer(llm: Any) -> Callable[[], float]:
    """One single-token decode on `llm` per call, timed (ms); the KV cache grows from an
    8-token prompt, as an answer's does."""
    import llama_cpp.llama_cpp as lib

    bos = llm.token_bos()
    llm.eval([bos if bos >= 0 else 0] * 8)
    slot = (lib.llama_token * 1)()
    batch = lib.llama_batch_get_one(slot, 1)
    ctx, decode = llm.ctx, lib.llama_decode
    n = [8]

    def step() -> float:
        if n[0] >= 500:  # keep inside the 512-token context
            lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
            n[0] = 0
        slot[0] = 100 + n[0] % 200
        t0 = time.perf_counter_ns()
        if rc := decode(ctx, batch):
            raise RuntimeError(f"llama_decode returned {rc}")
        n[0] += 1
        return (time.perf_counter_ns() - t0) / 1e6

    return step
