"""`phasechat ablate --chat ID`: what each part of a saved chat's last prompt is worth
(chat/trips/ablate.py). Nothing is saved; the chat is opened read-only.

A long chat is many cold runs (a 200-turn chat at --repeat 3: 603), so the count and an
estimate are said first, on stderr; past `ASK_ABOVE_RUNS` runs (or `ASK_ABOVE_MS`: both
in chat/trips/ablate.py) a terminal is asked, and without one the job is refused unless
`--yes` or `--max-runs N` says how many runs are welcome. Each run is reported on stderr
as it ends, with --json too (stdout stays the one JSON object).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from typing import Any

from phasechat.backends.local.models import ModelNotFound
from phasechat.chat.config.file import ConfigError
from phasechat.chat.costs import history_metrics
from phasechat.chat.store.database import ChatNotFound, StoreError
from phasechat.chat.trips.ablate import (
    ASK_ABOVE_RUNS,
    CACHE_AFTER,
    FIGURES,
    Ablation,
    Variant,
    ablation_title,
    duration,
    is_long,
    plan_line,
    report_lines,
)
from phasechat.chat.turns import InputError
from phasechat.chat.workspace import Workspace
from phasechat.cli.commands.options import add_backend_options, build_workspace, fail, parse_chat_id
from phasechat.telemetry.forecast import measured_rates
from phasechat.telemetry.records import dumps


def add_parser(sub: Any) -> None:
    """Register `ablate` on the subcommand parsers `sub`."""
    p = sub.add_parser(
        "ablate",
        help="a saved chat's last turn again without each part of its prompt: what each costs",
        allow_abbrev=False,
    )
    add_backend_options(p, top=False)
    p.add_argument("--chat", required=True, metavar="ID", help="the saved chat (its last turn)")
    p.add_argument(
        "--repeat", type=int, default=3, help="cold runs of each variant (default 3; medians)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument(
        "--yes",
        action="store_true",
        help=f"start however many runs it takes, without asking (past {ASK_ABOVE_RUNS} runs a "
        "terminal is asked; without one, they are refused unless --yes or --max-runs)",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        metavar="N",
        help="start at most N runs without asking: more are refused, nothing run",
    )


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    try:
        chat_id = parse_chat_id(args.chat)
    except ValueError as exc:
        return fail(str(exc))
    if args.repeat < 1:
        return fail("--repeat must be 1 or more")
    if args.max_runs is not None and args.max_runs < 1:
        return fail("--max-runs must be 1 or more")
    try:
        workspace = build_workspace(args, all_backends=False)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    try:
        ablation = await _ablate(workspace, chat_id, args)
    except (InputError, ChatNotFound, StoreError, sqlite3.Error, RuntimeError) as exc:
        return fail(str(exc))
    finally:
        await workspace.aclose()
    if ablation is None:
        return 1
    if args.json:
        print(dumps(_record(ablation, chat_id, args.repeat)))
    else:
        _print(ablation, chat_id, args.repeat)
    return 0


async def _ablate(workspace: Workspace, chat_id: int, args: argparse.Namespace) -> Ablation | None:
    workspace.open_store(readonly=True)
    if workspace.store is None:
        raise StoreError("the chat database cannot be opened")
    workspace.open_chat(chat_id, save=False)
    last = workspace.turns.last_request()
    if last is None:
        raise InputError(f"chat {chat_id} has no answered question to ablate")
    messages = last[0]
    backend = workspace.backend
    ablation = Ablation(backend, workspace.turns.settings, messages)
    if len(ablation.variants) == 1:
        raise InputError(
            f"chat {chat_id}'s last prompt has nothing to remove: "
            "no system prompt, no earlier exchange"
        )
    # before the model loads: the count, the estimate and the question come first
    total = ablation.runs(args.repeat)
    rates = measured_rates(history_metrics(workspace.turns), backend.name)
    estimate = ablation.estimate_ms(args.repeat, rates)
    print(plan_line(ablation, args.repeat, estimate), file=sys.stderr, flush=True)
    _consent(args, total, estimate)
    await backend.start()
    if backend.state == "failed":
        fail(backend.state_detail)
        return None
    progress = Progress(total)
    await ablation.run(args.repeat, progress.ran)
    progress.end()
    return ablation


def _consent(args: argparse.Namespace, runs: int, estimate_ms: float | None) -> None:
    """Go on, or raise InputError (one line, nothing run): more than --max-runs, or a
    long job declined on a terminal, or one without a terminal to ask on and no --yes."""
    if args.max_runs is not None:
        if runs > args.max_runs:
            raise InputError(
                f"{runs:,} runs exceed --max-runs {args.max_runs:,}: nothing run "
                "(fewer: --repeat 1, or a chat with fewer turns)"
            )
        return
    if args.yes or not is_long(runs, estimate_ms):
        return
    if not sys.stdin.isatty():
        raise InputError(
            f"{runs:,} cold runs is a long job and there is no terminal to ask: "
            f"pass --yes or --max-runs {runs} to start them"
        )
    print(f"start {runs:,} runs? [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise InputError("nothing run")


class Progress:
    """Each run as it ends, on stderr: one line rewritten on a terminal, else a line a
    run (a log), with the time left at the pace so far."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()

    def ran(self, variant: Variant, _metrics: object) -> None:
        self.done += 1
        name = variant.cut.name if variant.cut is not None else "the full prompt"
        left = (time.monotonic() - self.start) / self.done * (self.total - self.done)
        line = f"run {self.done:,}/{self.total:,} ({name}), about {duration(left * 1000)} left"
        if self.tty:
            print(f"\r{line:<72}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _record(ablation: Ablation, chat_id: int, repeat: int) -> dict[str, object]:
    anatomy = ablation.anatomy
    return {
        "chat_id": chat_id,
        "backend": ablation.backend.name,
        "model": ablation.backend.model,
        "repeat": repeat,
        "temperature": ablation.settings.temperature,
        "prompt_tokens": ablation.prompt_tokens,
        "kept_tokens": ablation.kept_tokens(),
        "sections_source": anatomy.source if anatomy is not None else None,
        "full": {key: ablation.full.median(read) for key, read in FIGURES},
        "sections": [row.as_dict() for row in ablation.rows()],
        "cache_after": CACHE_AFTER,
    }


def _print(ablation: Ablation, chat_id: int, repeat: int) -> None:
    print(f"chat {chat_id}'s last turn: {ablation_title(ablation, repeat)}")
    for line in report_lines(ablation):
        print(line)
