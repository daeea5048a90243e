"""`phasechat bench SCRIPT`: the command line over chat/trips/replay.py; `phasechat bench
--sweep 1,2,4,8`: over chat/trips/sweep.py (a remote server's batching curve)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

from phasechat.backends.local.models import ModelNotFound
from phasechat.chat.config.file import ConfigError
from phasechat.chat.config.settings import Settings
from phasechat.chat.text import one_line
from phasechat.chat.trips.replay import Script, TurnRow, load_script, replay
from phasechat.chat.trips.sweep import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_PER_STREAM,
    DEFAULT_REPEATS,
    EXTRA_REPEATS,
    LevelRun,
    SweepResult,
    sweep,
)
from phasechat.chat.trips.sweep_chart import (
    SWEEP_HEADER,
    result_chart,
    sweep_notes,
    sweep_row,
    warm_up_line,
)
from phasechat.chat.workspace import Workspace
from phasechat.cli.commands.options import build_workspace, fail
from phasechat.telemetry.sweep_stats import Slo, parse_levels

#: the longest pause between turns: an hour (a user reading; longer is a mistake)
MAX_THINK_S = 3600.0


def add_options(p: argparse.ArgumentParser) -> None:
    """`bench`'s own options (the backend and engine ones come from commands/options.py)."""
    p.add_argument(
        "script",
        nargs="?",
        help='JSON: {"system": ..., "turns": [...], "max_tokens": 64} (not with --sweep)',
    )
    p.add_argument("--no-trim", action="store_true", help="send the whole history every turn")
    p.add_argument("--json", action="store_true", help="one JSON object per turn, then totals")
    p.add_argument(
        "--think-time",
        type=float,
        default=0.0,
        metavar="S",
        help="wait S seconds between turns, as a user reads and types (default 0)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="remote backends: replay N copies of the chat at once (aggregate tok/s)",
    )
    g = p.add_argument_group("sweep (remote backends)")
    g.add_argument(
        "--sweep",
        metavar="LEVELS",
        help="concurrency levels, e.g. 1,2,4,8: throughput, latency and the knee per level",
    )
    g.add_argument(
        "--per-stream",
        type=int,
        default=DEFAULT_PER_STREAM,
        metavar="N",
        help=f"sweep: requests each concurrent stream sends in turn (default {DEFAULT_PER_STREAM})",
    )
    g.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        metavar="N",
        help=f"sweep: runs of each level, read as their median and p10-p90 (default"
        f" {DEFAULT_REPEATS}; a level noisier than its step runs up to {EXTRA_REPEATS} more)",
    )
    g.add_argument("--slo-ttft-ms", type=float, help="sweep goodput: a request's TTFT limit")
    g.add_argument("--slo-tpot-ms", type=float, help="sweep goodput: a request's TPOT limit")


def run(args: argparse.Namespace) -> int:
    """Run `phasechat bench`; returns the exit status."""
    if args.sweep is not None:
        return run_sweep(args)
    if args.script is None:
        return fail("bench needs a script (or --sweep LEVELS)")
    if args.concurrency < 1:
        return fail("--concurrency must be 1 or more")
    if not 0 <= args.think_time <= MAX_THINK_S:  # NaN fails too
        return fail(f"--think-time must be 0 to {MAX_THINK_S:g} seconds")
    try:
        script = load_script(Path(args.script).expanduser())
        workspace = build_workspace(args, all_backends=False)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if args.concurrency > 1 and workspace.backend.serial:
        return fail("--concurrency needs a remote backend: the local model answers one at a time")
    settings = workspace.turns.settings
    if args.max_tokens is None and script.max_tokens is not None:
        settings = replace(settings, max_tokens=script.max_tokens)
    return asyncio.run(_bench(args, script, workspace, settings))


async def _bench(
    args: argparse.Namespace, script: Script, workspace: Workspace, settings: Settings
) -> int:
    backend = workspace.backend
    try:
        await backend.start()
        if backend.state == "failed":
            return fail(backend.state_detail)
        result = await replay(
            backend,
            script,
            settings,
            trim=not args.no_trim,
            concurrency=args.concurrency,
            configure=workspace.configure_trimmer,
            think_time_s=max(0.0, args.think_time),
            on_row=_json_row if args.json else _text_row,
        )
    finally:
        await workspace.aclose()
    print(json.dumps(result.totals()) if args.json else result.summary_line())
    return 0


def _text_row(row: TurnRow) -> None:
    print(row.line(), flush=True)


def _json_row(row: TurnRow) -> None:
    print(json.dumps(row.record(), ensure_ascii=False), flush=True)


def run_sweep(args: argparse.Namespace) -> int:
    """`phasechat bench --sweep LEVELS`; returns the exit status."""
    try:
        levels = parse_levels(args.sweep)
    except ValueError as exc:
        return fail(str(exc))
    if args.script is not None:
        return fail("--sweep sends its own one-turn prompts: leave out the script")
    if args.per_stream < 1:
        return fail("--per-stream must be 1 or more")
    if args.repeats < 1:
        return fail("--repeats must be 1 or more")
    for name in ("slo_ttft_ms", "slo_tpot_ms"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):  # NaN: every
            return fail(f"--{name.replace('_', '-')} must be positive")  # answer "met" it
    try:
        workspace = build_workspace(args, all_backends=False)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if workspace.backend.serial:
        return fail("--sweep needs a remote backend: the local model answers one at a time")
    settings = workspace.turns.settings
    if args.max_tokens is None:
        settings = replace(settings, max_tokens=DEFAULT_MAX_TOKENS)
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    return asyncio.run(_sweep(args, workspace, settings, levels, slo))


async def _sweep(
    args: argparse.Namespace,
    workspace: Workspace,
    settings: Settings,
    levels: tuple[int, ...],
    slo: Slo,
) -> int:
    backend = workspace.backend
    if not args.json:
        print(SWEEP_HEADER, flush=True)
    try:
        await backend.start()
        if backend.state == "failed":
            return fail(backend.state_detail)
        result = await sweep(
            backend,
            levels,
            settings,
            per_stream=args.per_stream,
            slo=slo,
            on_level=None if args.json else _RowPrinter(),
            repeats=args.repeats,
        )
    finally:
        await workspace.aclose()
    if args.json:
        print(json.dumps(result.record(), ensure_ascii=False))
    else:
        print(sweep_report(result, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR")))
    return 1 if any(lv.completed == 0 for lv in result.levels) else 0


class _RowPrinter:
    """Prints each level's row as it settles, flagged against the level before."""

    def __init__(self) -> None:
        self.previous: LevelRun | None = None

    def __call__(self, run: LevelRun) -> None:
        print(sweep_row(run, run.step_from(self.previous)), flush=True)
        self.previous = run


def sweep_report(result: SweepResult, *, color: bool = False) -> str:
    """After the table: its warm-up line, the chart, the growth per doubling, the knee."""
    title = f"{one_line(result.backend)} · {one_line(result.model)}"
    chart = result_chart(result, color=color, title=title)
    return "\n".join([warm_up_line(result), chart, *sweep_notes(result)])
