"""This machine's memory bandwidth, measured by a short probe (no numpy).

A copy of a buffer much larger than any CPU cache, repeated, best of N: each copy
reads `size` bytes and writes `size` bytes, so bandwidth = 2 x size / time (the STREAM
"copy" convention). The copy is split between one thread per CPU this process may run
on, started together and timed until the last one ends, so the figure is what all the
cores together can move (llama.cpp decodes with several threads), not one core's copy.
`ctypes.memmove` releases the GIL, so the threads copy at once. The rounds go on for
at least `MIN_S`, long enough to read how busy other processes kept the CPUs meanwhile
(a probe beside a compiler measured 14.3 GB/s where a quiet machine moves 35-38).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

from phasechat.backends.local.measured import others_during

#: 128 MiB: larger than the last-level cache of any current CPU, small enough to spare.
PROBE_BYTES = 128 * 2**20
PROBE_ROUNDS = 6
#: seconds of copying at least: /proc/stat counts 10 ms ticks (backends/local/threads.py CpuShare)
MIN_S = 0.4
#: rounds at most, whatever MIN_S asks
MAX_ROUNDS = 400


@dataclass(frozen=True, slots=True)
class Probed:
    """A probe's figure, how many threads copied, and the share (0-1) of the CPUs that
    other processes used meanwhile (None: unknown)."""

    gb_s: float
    threads: int
    others: float | None


def probe_threads() -> int:
    """One copying thread per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def probe_bandwidth(
    size: int = PROBE_BYTES,
    rounds: int = PROBE_ROUNDS,
    threads: int | None = None,
    min_s: float = MIN_S,
) -> Probed:
    """GB/s (1e9 bytes) moved by the fastest of `rounds` (or more, for `min_s`) copies of
    `size` bytes split between `threads` threads (default: one per CPU), summed."""
    if size <= 0 or rounds <= 0:
        raise ValueError("size and rounds must be positive")
    n = threads or probe_threads()
    gb_s, others = others_during(lambda: copy_rate(size, rounds, n, min_s))
    return Probed(gb_s, n, others)


def copy_rate(size: int, rounds: int, threads: int, min_s: float = 0.0) -> float:
    """GB/s of the fastest round in which `threads` threads each copy their share of
    `size` bytes, timed from the start of all to the end of the last."""
    chunk = max(1, size // threads)
    buffers = [
        (ctypes.create_string_buffer(chunk), ctypes.create_string_buffer(chunk))
        for _ in range(threads)
    ]
    for src, dst in buffers:  # written, so their pages are real before timing
        ctypes.memset(src, 0x5A, chunk)
        ctypes.memset(dst, 0, chunk)
    start, end = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

    def copy(src: ctypes.Array[ctypes.c_char], dst: ctypes.Array[ctypes.c_char]) -> None:
        try:
            while True:
                start.wait()
                ctypes.memmove(dst, src, chunk)
                end.wait()
        except threading.BrokenBarrierError:  # the probe is over
            return

    workers = [threading.Thread(target=copy, args=pair, daemon=True) for pair in buffers]
    for worker in workers:
        worker.start()
    best, spent, done = float("inf"), 0.0, 0
    try:
        while done < rounds or (spent < min_s and done < MAX_ROUNDS):
            t0 = time.perf_counter()
            start.wait()
            end.wait()
            took = time.perf_counter() - t0
            best, spent, done = min(best, took), spent + took, done + 1
    finally:
        start.abort()
        end.abort()
        for worker in workers:
            worker.join()
    return 2 * chunk * threads / best / 1e9
