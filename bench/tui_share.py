"""Does the TUI slow the engine down? The same prompt on the bundled model, headless (as
`phasechat ask` runs it) and in the TUI (under Textual's `run_test`, which draws every
frame as a terminal would, minus the terminal), interleaved in one process.

    .venv/bin/python -m bench.tui_share [--rounds 3] [--tokens 400] [--threads N]
        [--model PATH|fast] [--pace auto|full|shared] [--switch-interval S]
        [--engine process|inline]

Prints per round the decode rate we measure and llama.cpp's own (its perf counters),
the ratio TUI / headless (goal >= 0.95, issues 13 and 35), the gaps between tokens
(median, p99, max, and how many were over 3x the median: the stalls), and the CPU time
of each thread of this process per second of streaming: the UI thread's share is what
the app takes from the engine.

`--model fast` is bench/fast_model.py: the bundled tokenizer and template on 2 narrow
layers, ~1 ms a token on this CPU, as the bundled model is on a GPU. `--pace` forces how
the UI draws while the answer streams: `full` every frame (REFRESH_HZ, tokens handed
over as they come), `shared` as for an engine that shares this process (SHARED_HZ),
`auto` what the app chooses for this backend. `--engine`: the TUI's engine in a process
of its own (the default, as `phasechat` runs it: backends/local/engine_process.py) or in the
app's process (as before issue 35); headless is always in-process, as `ask` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import ClassVar

from bench import fast_model
from phasechat.backends.base import Backend
from phasechat.backends.events import Event, TextDelta
from phasechat.backends.local import backend as local
from phasechat.backends.local import handoff
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.engine_process import EngineProcess
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
    turns = TurnController(backend, settings)
    before, t0 = thread_cpu(), time.perf_counter()
    await turns.send(PROMPT)
    m = turns.exchanges[-1].metrics
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


def gaps(m: Metrics) -> str:
    """The gaps between tokens: median, p99, max (ms)."""
    return (
        f"itl p50 {m.itl_ms_p50 or 0:.2f} p99 {m.itl_ms_p99 or 0:.2f} max {m.itl_ms_max or 0:.1f}"
    )


async def tui(backend: Backend, settings: Settings) -> tuple[Metrics, str]:
    from phasechat.tui.app import PhasechatApp

    app = PhasechatApp(settings=settings, backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)  # the first layout and start-up work
        before, t0 = thread_cpu(), time.perf_counter()
        Stamped.stamps.clear()
        assert app.chat.send(PROMPT)
        # Waited for, not polled: a poll is a wake-up of this thread the app would not have.
        for worker in [w for w in app.workers if w.group == "generate"]:
            await worker.wait()
        after, wall = thread_cpu(), time.perf_counter() - t0
        used = delta(before, after, wall)
        m = app.turns.exchanges[-1].metrics
    assert m is not None
    if len(Stamped.stamps) >= 2:  # the engine hands over in this process: its decode window
        (w0, c0), (w1, c1) = Stamped.stamps[0], Stamped.stamps[-1]
        UI_MS.append((c1 - c0) / (w1 - w0) * 1000)
        return m, f"{used}; ui while decoding {UI_MS[-1]:.0f} ms/s"
    # an engine process hands over in its own: the UI's CPU over the whole answer
    UI_MS.append((after["ui"] - before["ui"]) / wall * 1000)
    return m, f"{used}; ui over the answer {UI_MS[-1]:.0f} ms/s"


async def main(args: argparse.Namespace) -> None:
    local.Handoff = Stamped  # type: ignore[misc]
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.pace != "auto":
        shared = args.pace == "shared"
        for kind in (LocalBackend, EngineProcess):
            kind.shares_cpu = property(lambda _: shared)  # type: ignore[assignment,method-assign]
    model = fast_model.resolve(args.model)
    load = os.getloadavg()
    print(
        f"# bench.tui_share · {model.name} · pace {args.pace} · switch interval "
        f"{sys.getswitchinterval() * 1000:g} ms · load {load[0]:.2f} {load[1]:.2f} "
        f"on {os.cpu_count()} CPUs"
    )
    config = LocalConfig(model_path=model, threads=args.threads)
    backend = LocalBackend(config)
    await backend.start()
    print(f"# {backend.state_detail}")
    # The TUI's engine: this one (in the app's process), or the same model in a process
    # of its own (backends/local/engine_process.py, as `phasechat` runs it).
    shown: Backend = backend
    if args.engine == "process":
        shown = EngineProcess(config)
        await shown.start()
        print(f"# TUI: engine process {shown.pid}: {shown.state_detail}")
    settings = Settings(max_tokens=args.tokens, temperature=0)
    ratios: list[float] = []
    try:
        print(f"{'round':<6} {'where':<9} {'decode':>7} {'engine':>7}  CPU s per s of streaming")
        for r in range(1, args.rounds + 1):
            if r % 2:  # each goes first in every other round (the VM's speed drifts)
                h, h_cpu = await headless(backend, settings)
                t, t_cpu = await tui(shown, settings)
            else:
                t, t_cpu = await tui(shown, settings)
                h, h_cpu = await headless(backend, settings)
            for where, m, cpu in (("headless", h, h_cpu), ("TUI", t, t_cpu)):
                print(
                    f"{r:<6} {where:<9} {m.decode_tok_s or 0:7.1f} "
                    f"{m.server_decode_tok_s or 0:7.1f}  {gaps(m)}; {cpu}"
                )
            ratios.append((t.decode_tok_s or 0) / (h.decode_tok_s or 1))
    finally:
        await backend.aclose()
        if shown is not backend:
            await shown.aclose()
    print(
        f"TUI / headless decode: {', '.join(f'{x:.3f}' for x in ratios)} "
        f"(median {statistics.median(ratios):.3f}; goal >= 0.95)"
    )
    print(f"UI thread: median {statistics.median(UI_MS):.0f} ms of CPU per s")
    load = os.getloadavg()
    print(f"# after: load {load[0]:.2f} {load[1]:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        prog="python -m bench.tui_share", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--model", help="GGUF path, or 'fast' (bench/fast_model.py)")
    p.add_argument("--pace", choices=("auto", "full", "shared"), default="auto")
    p.add_argument("--switch-interval", type=float, help="sys.setswitchinterval, seconds")
    p.add_argument(
        "--engine",
        choices=("process", "inline"),
        default="process",
        help="the TUI's engine: a process of its own (as phasechat runs it) or in the app's",
    )
    asyncio.run(main(p.parse_args()))
