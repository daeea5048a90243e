"""Does the TUI slow the engine down? The same prompt on the bundled model, headless (as
`phasechat ask` runs it) and in the TUI (under Textual's `run_test`, which draws every
frame as a terminal would, minus the terminal), interleaved in one process.

    .venv/bin/python -m bench.tui_share [--rounds 3] [--tokens 400] [--threads N]

Prints per round the decode rate we measure and llama.cpp's own (its perf counters),
the ratio TUI / headless (goal >= 0.95, issue 13 item 2), and the CPU time of each
thread of this process per second of streaming: the UI thread's share is what the
app takes from the engine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import ClassVar

from phasechat.backends import handoff, local
from phasechat.backends.events import Event, TextDelta
from phasechat.backends.local import LocalBackend, LocalConfig
from phasechat.backends.models import default_model_path
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.metrics import Metrics

PROMPT = "Write a long, detailed story about a lighthouse keeper and the sea."
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by name (the main thread: "ui")."""
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = (
            "ui" if int(task.name) == os.getpid() else stat[stat.index("(") + 1 : stat.rindex(")")]
        )
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def delta(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    """CPU per second of wall time, per thread group (only those that used any)."""
    used = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / seconds for k in after}
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(used.items()) if v >= 0.01)


async def headless(backend: LocalBackend, settings: Settings) -> tuple[Metrics, str]:
    session = TurnController(backend, settings)
    before, t0 = thread_cpu(), time.perf_counter()
    async for _ in session.send(PROMPT):
        pass
    m = session.exchanges[-1].metrics
    assert m is not None
    return m, delta(before, thread_cpu(), time.perf_counter() - t0)


class Stamped(handoff.Handoff):
    """The local backend's hand-over, stamping this (the UI) thread's CPU time each
    time it delivers tokens: the UI's CPU during the decode window alone."""

    stamps: ClassVar[list[tuple[float, float]]] = []  # (wall s, UI thread CPU s)

    async def take(self) -> list[Event]:
        items = await super().take()
        if any(isinstance(e, TextDelta) for e in items):
            self.stamps.append((time.perf_counter(), time.thread_time()))
        return items


UI_MS: list[float] = []  # the UI thread's CPU ms per s of decode, per TUI answer


async def tui(backend: LocalBackend, settings: Settings) -> tuple[Metrics, str]:
    from phasechat.tui.app import PhasechatApp

    app = PhasechatApp(settings=settings, backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)  # the first layout and start-up work
        before, t0 = thread_cpu(), time.perf_counter()
        Stamped.stamps.clear()
        assert app.send(PROMPT)
        # Waited for, not polled: a poll is a wake-up of this thread the app would not have.
        for worker in [w for w in app.workers if w.group == "generate"]:
            await worker.wait()
        used = delta(before, thread_cpu(), time.perf_counter() - t0)
        m = app.turns.exchanges[-1].metrics
    assert m is not None
    (w0, c0), (w1, c1) = Stamped.stamps[0], Stamped.stamps[-1]
    UI_MS.append((c1 - c0) / (w1 - w0) * 1000)
    return m, f"{used}; ui while decoding {UI_MS[-1]:.0f} ms/s"


async def main(args: argparse.Namespace) -> None:
    local.Handoff = Stamped  # type: ignore[misc]
    load = os.getloadavg()
    print(f"# bench.tui_share · load {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} CPUs")
    backend = LocalBackend(LocalConfig(model_path=default_model_path(), threads=args.threads))
    await backend.start()
    settings = Settings(max_tokens=args.tokens, temperature=0)
    ratios: list[float] = []
    try:
        print(f"{'round':<6} {'where':<9} {'decode':>7} {'engine':>7}  CPU s per s of streaming")
        for r in range(1, args.rounds + 1):
            if r % 2:  # each goes first in every other round (the VM's speed drifts)
                h, h_cpu = await headless(backend, settings)
                t, t_cpu = await tui(backend, settings)
            else:
                t, t_cpu = await tui(backend, settings)
                h, h_cpu = await headless(backend, settings)
            for where, m, cpu in (("headless", h, h_cpu), ("TUI", t, t_cpu)):
                print(
                    f"{r:<6} {where:<9} {m.decode_tok_s or 0:7.1f} "
                    f"{m.server_decode_tok_s or 0:7.1f}  {cpu}"
                )
            ratios.append((t.decode_tok_s or 0) / (h.decode_tok_s or 1))
    finally:
        await backend.aclose()
    print(
        f"TUI / headless decode: {', '.join(f'{x:.3f}' for x in ratios)} "
        f"(median {statistics.median(ratios):.3f}; goal >= 0.95)"
    )
    print(f"UI thread while decoding: median {statistics.median(UI_MS):.0f} ms of CPU per s")
    load = os.getloadavg()
    print(f"# after: load {load[0]:.2f} {load[1]:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        prog="python -m bench.tui_share", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--threads", type=int, default=None)
    asyncio.run(main(p.parse_args()))
