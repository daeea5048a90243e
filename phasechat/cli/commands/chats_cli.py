"""`phasechat chats`: list, export, rename, delete and search saved chats."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Iterable
from dataclasses import asdict
from datetime import datetime

from phasechat.chat.store.database import ChatNotFound, ChatStore, StoreError
from phasechat.chat.store.export import FORMATS, to_json, to_markdown
from phasechat.chat.text import one_line, visible_controls
from phasechat.cli.commands.options import parse_chat_id
from phasechat.telemetry.records import dumps


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `chats` and its subcommands to the top-level subparsers."""
    chats = sub.add_parser(
        "chats", help="saved chats: list, export, rename, delete, search", allow_abbrev=False
    )
    chats.add_argument("--json", action="store_true", help="list as JSON")
    cmd = chats.add_subparsers(dest="chats_command")
    export = cmd.add_parser("export", help="print one chat as Markdown or JSON", allow_abbrev=False)
    export.add_argument("id", help="the chat id (see `phasechat chats`)")
    export.add_argument("--format", choices=FORMATS, default="md")
    rename = cmd.add_parser("rename", help="give a chat a new title", allow_abbrev=False)
    rename.add_argument("id")
    rename.add_argument("title")
    delete = cmd.add_parser("delete", help="delete a chat and its messages", allow_abbrev=False)
    delete.add_argument("id")
    search = cmd.add_parser(
        "search", help="find messages that contain every word", allow_abbrev=False
    )
    search.add_argument("text")
    search.add_argument("--json", action="store_true", help="print the hits as JSON")


def _when(t: datetime | None) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M") if t is not None else "unknown"


def _warn(lines: Iterable[str]) -> None:
    """Each cell that could not be read, one warning line each on stderr."""
    for line in lines:
        print(f"phasechat: warning: {one_line(line)}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run `phasechat chats ...`; returns the exit status."""
    # Reading commands never write: a database from a newer phasechat is read, not
    # downgraded, and a read-only data directory still lists and exports.
    readonly = args.chats_command in (None, "export", "search")
    try:
        with ChatStore(readonly=readonly) as store:
            return _run(store, args)
    except BrokenPipeError:
        # `phasechat chats export 3 | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ChatNotFound, ValueError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        print(f"phasechat: {visible_controls(str(msg))}", file=sys.stderr)
        return 2
    except (StoreError, sqlite3.Error, OSError) as exc:
        # A damaged or truncated file, a read-only folder, a data path that is a file.
        print(f"phasechat: {visible_controls(' '.join(str(exc).split()))}", file=sys.stderr)
        return 1


def _run(store: ChatStore, args: argparse.Namespace) -> int:
    out = sys.stdout
    command = args.chats_command
    if command is None:
        chats = store.list_chats()
        _warn(line for c in chats for line in c.unreadable)
        if args.json:
            print(dumps([c.as_dict() for c in chats]))
            return 0
        if not chats:
            print("no saved chats yet: `phasechat ask` and the chat UI save each chat")
            return 0
        print(f"{'ID':>5}  {'UPDATED':16}  {'MSGS':>4}  {'BACKEND':10}  TITLE")
        for c in chats:
            title = visible_controls(c.title)
            out.write(f"{c.id:>5}  {_when(c.updated):16}  {c.messages:>4}  ")
            out.write(f"{visible_controls(c.backend or '-'):10}  {title}\n")
        return 0
    if command == "export":
        chat_id = parse_chat_id(args.id)
        summary, saved = store.get(chat_id), store.open_chat(chat_id)
        _warn((*summary.unreadable, *saved.unreadable))
        if args.format == "json":  # every branch, with the ids the database gives them
            out.write(to_json(summary, saved.conversation, saved.rows) + "\n")
        else:  # the branch the chat shows
            out.write(to_markdown(summary, saved.conversation))
        return 0
    if command == "rename":
        store.rename(parse_chat_id(args.id), args.title)
        return 0
    if command == "delete":
        store.delete(parse_chat_id(args.id))
        return 0
    assert command == "search"
    hits = store.search(args.text)
    if args.json:
        print(dumps([asdict(h) for h in hits]))
        return 0
    for h in hits:
        line = f"{h.chat_id:>5}  {h.title[:30]:30}  {h.role:9}  {h.snippet}"
        out.write(visible_controls(line) + "\n")
    return 0 if hits else 1
