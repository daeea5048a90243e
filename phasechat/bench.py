"""`phasechat bench SCRIPT`: the command line over chat/replay.py."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path

from phasechat.backends.models import ModelNotFound
from phasechat.chat.config import ConfigError
from phasechat.chat.replay import Script, TurnRow, load_script, replay
from phasechat.chat.settings import Settings
from phasechat.chat.workspace import Workspace
from phasechat.options import build_workspace, fail


def add_options(p: argparse.ArgumentParser) -> None:
    """`bench`'s own options (the backend and engine ones come from phasechat.options)."""
    p.add_argument("script", help='JSON: {"system": ..., "turns": [...], "max_tokens": 64}')
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


def run(args: argparse.Namespace) -> int:
    """Run `phasechat bench`; returns the exit status."""
    if args.concurrency < 1:
        return fail("--concurrency must be 1 or more")
    try:
        script = load_script(Path(args.script).expanduser())
        workspace = build_workspace(args, all_backends=False)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if args.concurrency > 1 and workspace.backend.serial:
        return fail("--concurrency needs a remote backend: the local model answers one at a time")
    settings = workspace.session.settings
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
