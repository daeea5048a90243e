"""The `phasechat` command: the TUI by default, plus headless `ask`, `chats` and `doctor`.

Nothing here imports Textual unless the TUI is started, so `ask` and `doctor` start fast
and work without a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
from collections.abc import Sequence

from backends.events import TextDelta
from backends.models import ModelNotFound
from chat.config import ConfigError
from chat.export import dumps
from chat.profiles import make_backend
from chat.session import ChatSession, InputError
from chat.store import ChatStore
from chat.text import visible_controls
from phasechat import bench, chats
from phasechat.options import add_backend_options, all_profiles, backend_spec, read_config, settings

__all__ = ["backend_spec", "main", "read_config", "settings"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phasechat",
        description="Chat with an LLM and see where the time goes: prefill vs decode.",
    )
    add_backend_options(parser)
    sub = parser.add_subparsers(dest="command")
    ask = sub.add_parser("ask", help="answer one prompt on stdout (headless)")
    add_backend_options(ask, top=False)
    ask.add_argument("--json", action="store_true", help="print one JSON object instead")
    ask.add_argument("--no-save", action="store_true", help="do not save the exchange as a chat")
    ask.add_argument("prompt", help="the prompt ('-' reads stdin)")
    chats.add_parser(sub)
    bench_p = sub.add_parser("bench", help="replay a scripted chat: prefill and cache per turn")
    add_backend_options(bench_p, top=False)
    bench.add_options(bench_p)
    sub.add_parser("doctor", help="llama.cpp build, GPU offload and the default model")
    return parser


def _open_store(session: ChatSession) -> ChatStore | None:
    """A store following `session` in a new chat; None (with a warning) if it cannot."""
    try:
        store = ChatStore()
        store.attach(session, store.create_chat(system=session.settings.system))
    except (sqlite3.Error, OSError) as exc:
        print(f"phasechat: warning: chat not saved: {exc}", file=sys.stderr)
        return None
    return store


def fail(message: str, code: int = 2) -> int:
    print(f"phasechat: {visible_controls(message)}", file=sys.stderr)
    return code


async def ask(args: argparse.Namespace) -> int:
    """Stream one answer to stdout, or print one JSON object with --json."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        config = read_config(args)
        spec = backend_spec(args, config)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    backend = make_backend(spec)
    session = ChatSession(backend, settings(args, config))
    store: ChatStore | None = None
    try:
        if not prompt.strip():
            raise InputError("empty prompt: nothing to ask")
        await backend.start()
        if backend.state == "failed":
            return fail(backend.state_detail)
        if not args.no_save:
            store = _open_store(session)
        out = sys.stdout
        async for event in session.send(prompt):
            if isinstance(event, TextDelta) and event.text and not args.json:
                out.write(visible_controls(event.text))
                out.flush()
    except InputError as exc:
        return fail(str(exc))
    finally:
        await backend.aclose()
        if store is not None:
            if store.error:
                print(f"phasechat: warning: {store.error}", file=sys.stderr)
            store.close()
    exchange = session.exchanges[-1]
    metrics = exchange.metrics
    assert metrics is not None
    if args.json:
        record = {"text": exchange.answer.content, **metrics.as_dict()}
        if store is not None:
            record["chat_id"] = store.chat_of(session)
        record["token_times_ms"] = [t / 1e6 for t in exchange.trace.times]
        print(dumps(record))
    elif exchange.answer.content and not exchange.answer.content.endswith("\n"):
        print()
    if exchange.answer.status == "error":
        return fail(exchange.answer.error or "the answer failed", 1)
    return 0


def doctor() -> int:
    """Print the llama.cpp build and the default model's geometry."""
    from phasechat.doctor import report

    print(report())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `phasechat doctor | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "ask":
        return asyncio.run(ask(args))
    if args.command == "doctor":
        return doctor()
    if args.command == "chats":
        return chats.run(args)
    if args.command == "bench":
        return bench.run(args)
    try:
        config = read_config(args)
        spec = backend_spec(args, config)
        profiles = all_profiles(spec, args, config)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if not sys.stdout.isatty() and not os.environ.get("PHASECHAT_FORCE_TUI"):
        return fail("the chat UI needs a terminal; use `phasechat ask` for headless use")
    from tui.app import PhasechatApp

    PhasechatApp(spec, settings(args, config), profiles=profiles, config=config).run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
