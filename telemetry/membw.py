"""This machine's memory bandwidth, measured by a short probe (no numpy).

A copy of a buffer much larger than any CPU cache, repeated, best of N: each copy
reads `size` bytes and writes `size` bytes, so bandwidth = 2 x size / time (the STREAM
"copy" convention). One thread copies, so this is what one core can move; llama.cpp's
decode with several threads can pull more, and a roofline share above 100% says so.
About 0.3 s with the defaults.
"""

from __future__ import annotations

import time

#: 128 MiB: larger than the last-level cache of any current CPU, small enough to spare.
PROBE_BYTES = 128 * 2**20
PROBE_ROUNDS = 6


def probe_bandwidth(size: int = PROBE_BYTES, rounds: int = PROBE_ROUNDS) -> float:
    """GB/s (1e9 bytes) moved by the fastest of `rounds` copies of `size` bytes."""
    if size <= 0 or rounds <= 0:
        raise ValueError("size and rounds must be positive")
    src = bytearray(b"\x5a") * size  # written, so its pages are real before timing
    dst = bytearray(size)
    view_src, view_dst = memoryview(src), memoryview(dst)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        view_dst[:] = view_src
        best = min(best, time.perf_counter() - t0)
    return 2 * size / best / 1e9
