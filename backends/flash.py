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
so later loads pay nothing. With layers on a GPU it is on, as llama.cpp's "auto" does.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: off must decode this much faster than on to be chosen
MARGIN = 0.03
ROUNDS = 4
STEPS = 16


@dataclass(frozen=True, slots=True)
class FlashChoice:
    """The choice, and the measurement behind it (step times in ms, medians)."""

    flash_attn: bool
    on_ms: float
    off_ms: float
    measured_at: str  # UTC, ISO 8601
    cached: bool = False

    @property
    def summary(self) -> str:
        """One line: "flash attention off (measured: 1.06x faster decode than on)"."""
        state = "on" if self.flash_attn else "off"
        when = "cached measurement" if self.cached else "measured at load"
        if self.flash_attn:
            ratio = self.on_ms / self.off_ms if self.off_ms else 1.0
            why = f"off was not faster: {ratio:.2f}x"
        else:
            why = f"{self.on_ms / self.off_ms:.2f}x faster decode than on"
        return f"flash attention {state} ({when} {self.measured_at[:10]}: {why})"


def decide(setting: bool | None, gpu: bool, model: Path, threads: int) -> tuple[bool, str]:
    """Flash attention for a load, and why: `setting` if given, on for a GPU, else the
    measured (or cached) choice."""
    if setting is not None:
        return setting, f"flash attention {'on' if setting else 'off'} (set)"
    if gpu:
        return True, "flash attention on (GPU offload: llama.cpp's auto)"
    choice = choose(model, threads)
    return choice.flash_attn, choice.summary


def cache_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("phasechat")) / "flash-attn.json"


def build_id() -> str:
    """The llama.cpp build llama-cpp-python loads: its version, CPU features and library."""
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
    """The cached choice for this model, build and thread count, if any."""
    try:
        data = json.loads(cache_file().read_text())
        return FlashChoice(**data[cache_key(model, threads)], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def choose(model: Path, threads: int) -> FlashChoice:
    """The cached choice, or measure now (a second or two) and cache it."""
    found = cached(model, threads)
    if found is not None:
        return found
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
            verbose=False,
        )

    on, off = make(True), make(False)
    try:
        on_ms, off_ms, off_wins = measure(step_timer(on), step_timer(off))
    finally:
        on.close()
        off.close()
    choice = FlashChoice(
        flash_attn=not (off_ms < on_ms * (1 - MARGIN) and off_wins > ROUNDS // 2),
        on_ms=on_ms,
        off_ms=off_ms,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    store(model, threads, choice)
    return choice


def measure(on: Callable[[], float], off: Callable[[], float]) -> tuple[float, float, int]:
    """Median step time (ms) of each side over ROUNDS interleaved rounds of STEPS steps
    (a neighbour's burst slows both sides alike), and in how many rounds off was faster:
    a choice that a burst made is not kept for good."""
    times: dict[bool, list[float]] = {True: [], False: []}
    off_wins = 0
    for _ in range(ROUNDS):
        a = [on() for _ in range(STEPS)]
        b = [off() for _ in range(STEPS)]
        off_wins += statistics.median(b) < statistics.median(a)
        times[True] += a
        times[False] += b
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


def store(model: Path, threads: int, choice: FlashChoice) -> None:
    """Add `choice` to the cache file (best effort: a read-only cache only costs time)."""
    path = cache_file()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    entry = asdict(choice)
    entry.pop("cached")
    data[cache_key(model, threads)] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass
