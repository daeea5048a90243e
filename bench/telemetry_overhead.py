"""Telemetry overhead on local decode: the recorder on vs off, side by side in one run.

Both arms stream the same greedy answer from the bundled model; "off" iterates the
backend's events bare, "on" goes through `telemetry.recorder.record` into a Trace (a
clock read and an append per token) and computes the metrics at the end. Decode rate is
measured the same way in both arms (tokens after the first / time from first to last
token), with the arms interleaved so machine noise hits both alike.

    .venv/bin/python -m bench.telemetry_overhead [--rounds 6] [--tokens 128]

Goal: overhead <= 1%.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator

from phasechat.backends.events import Event, GenerationRequest, Message, TextDelta
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record

PROMPT = "Write a long, detailed story about a lighthouse keeper and the sea."


async def decode_rate(events: AsyncIterator[Event]) -> tuple[float, int]:
    first = last = 0
    n = 0
    async for event in events:
        if isinstance(event, TextDelta) and event.tokens:
            last = time.perf_counter_ns()
            if n == 0:
                first = last
            n += 1
    return (n - 1) / ((last - first) / 1e9), n


async def main(rounds: int, tokens: int) -> None:
    backend = LocalBackend(LocalConfig(n_ctx=2048))
    await backend.start()
    request = GenerationRequest(
        (Message("system", "You are a storyteller."), Message("user", PROMPT)),
        max_tokens=tokens,
        temperature=0,
    )
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        rate, n_off = await decode_rate(backend.stream(request))
        off.append(rate)
        trace = Trace("local", backend.model)
        rate, n_on = await decode_rate(record(backend.stream(request), trace))
        compute(trace)
        on.append(rate)
        assert n_on == n_off, "both arms must decode the same answer"
    await backend.aclose()
    m_off, m_on = statistics.median(off), statistics.median(on)
    per_token_us = recorder_cost_us()
    print(f"tokens per answer           {n_off}  ({rounds} rounds per arm, interleaved)")
    print(f"decode tok/s, recorder off  median {m_off:.1f}  ({', '.join(f'{r:.1f}' for r in off)})")
    print(f"decode tok/s, recorder on   median {m_on:.1f}  ({', '.join(f'{r:.1f}' for r in on)})")
    print(
        f"on / off                    {m_on / m_off:.4f}  "
        f"(overhead {100 * (1 - m_on / m_off):+.2f}%, goal <= 1%)"
    )
    token_us = 1e6 / m_off
    print(
        f"recorder cost per token     {per_token_us:.2f} us = {100 * per_token_us / token_us:.3f}% "
        f"of one {token_us / 1000:.1f} ms decode step (noise-free figure)"
    )


def recorder_cost_us(n: int = 200_000) -> float:
    """Microseconds `Trace.observe` adds per token, timed in a tight loop."""
    trace = Trace("local", "m")
    delta = TextDelta("tok", 1)
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        trace.observe(delta, clock())
    return (clock() - t0) / n / 1000


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.tokens))
