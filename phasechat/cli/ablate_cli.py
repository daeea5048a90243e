"""`phasechat ablate --chat ID`: what each part of a saved chat's last prompt is worth
(chat/trips/ablate.py). Nothing is saved; the chat is opened read-only."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
from typing import Any

from phasechat.backends.models import ModelNotFound
from phasechat.chat.config.file import ConfigError
from phasechat.chat.store.database import ChatNotFound, StoreError
from phasechat.chat.store.export import dumps
from phasechat.chat.trips.ablate import (
    CACHE_AFTER,
    FIGURES,
    Ablation,
    ablation_title,
    report_lines,
)
from phasechat.chat.turns import InputError
from phasechat.chat.workspace import Workspace
from phasechat.cli.options import add_backend_options, build_workspace, fail, parse_chat_id


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


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    try:
        chat_id = parse_chat_id(args.chat)
    except ValueError as exc:
        return fail(str(exc))
    if args.repeat < 1:
        return fail("--repeat must be 1 or more")
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
    await backend.start()
    if backend.state == "failed":
        fail(backend.state_detail)
        return None
    ablation = Ablation(backend, workspace.turns.settings, messages)
    if len(ablation.variants) == 1:
        raise InputError(
            f"chat {chat_id}'s last prompt has nothing to remove: "
            "no system prompt, no earlier exchange"
        )
    total = len(ablation.variants) * args.repeat
    done = 0

    def progress(_variant: object, _metrics: object) -> None:
        nonlocal done
        done += 1
        if not args.json:
            print(f"\rrun {done}/{total}", end="", file=sys.stderr, flush=True)

    await ablation.run(args.repeat, progress)
    if not args.json:
        print(file=sys.stderr)
    return ablation


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
