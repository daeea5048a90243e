"""The `phasechat` command: the TUI by default, plus headless `ask`, `chats` and `doctor`.

Nothing here imports Textual unless the TUI is started, so `ask` and `doctor` start fast
and work without a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from phasechat import bench, chats, compare
from phasechat.backends.events import TextDelta
from phasechat.backends.models import ModelNotFound
from phasechat.chat.config import ConfigError
from phasechat.chat.export import dumps
from phasechat.chat.roofline import machine_bandwidth
from phasechat.chat.session import InputError
from phasechat.chat.text import is_text, visible_controls
from phasechat.options import add_backend_options, build_workspace, fail
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.verdict import stats_line, verdict


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
    ask.add_argument(
        "--stats",
        action="store_true",
        help="after the answer, its figures and the verdict (which phase ate the time) on stderr",
    )
    ask.add_argument("prompt", help="the prompt ('-' reads stdin)")
    chats.add_parser(sub)
    bench_p = sub.add_parser("bench", help="replay a scripted chat: prefill and cache per turn")
    add_backend_options(bench_p, top=False)
    bench.add_options(bench_p)
    compare.add_parser(sub)
    sub.add_parser("doctor", help="llama.cpp build, GPU offload and the default model")
    return parser


async def ask(args: argparse.Namespace) -> int:
    """Stream one answer to stdout, or print one JSON object with --json."""
    try:
        prompt = sys.stdin.buffer.read().decode() if args.prompt == "-" else args.prompt
    except UnicodeDecodeError:
        prompt = "\udcff"  # refused below like an argument that is not UTF-8
    if not is_text(prompt):
        # Before anything is created: no empty chat is left behind.
        return fail("the prompt is not valid UTF-8: nothing asked, nothing saved")
    try:
        workspace = build_workspace(args, all_backends=False)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    session, backend = workspace.session, workspace.backend
    chat_id: int | None = None
    try:
        if not prompt.strip():
            raise InputError("empty prompt: nothing to ask")
        await backend.start()
        if backend.state == "failed":
            return fail(backend.state_detail)
        if not args.no_save:
            for line in workspace.open_store():
                print(f"phasechat: warning: {visible_controls(line)}", file=sys.stderr)
            error = workspace.ensure_chat()
            if error:
                print(f"phasechat: warning: {visible_controls(error)}", file=sys.stderr)
        out = sys.stdout
        async for event in session.send(prompt):
            if isinstance(event, TextDelta) and event.text and not args.json:
                out.write(visible_controls(event.text))
                out.flush()
    except InputError as exc:
        return fail(str(exc))
    finally:
        store = workspace.store
        if store is not None:
            if store.error:
                print(f"phasechat: warning: {visible_controls(store.error)}", file=sys.stderr)
            chat_id = store.chat_of(session)
        await workspace.aclose()
    exchange = session.exchanges[-1]
    metrics = exchange.metrics
    assert metrics is not None
    if args.json:
        answer = exchange.answer
        record = {"text": answer.content, "reasoning": answer.reasoning, **metrics.as_dict()}
        if chat_id is not None:
            record["chat_id"] = chat_id
        record["token_times_ms"] = exchange.token_times_ms()
        print(dumps(record))
    elif exchange.answer.content and not exchange.answer.content.endswith("\n"):
        print()
    if args.stats:
        print_stats(metrics)
    if exchange.answer.status == "error":
        return fail(exchange.answer.error or "the answer failed", 1)
    return 0


def print_stats(metrics: Metrics) -> None:
    """`ask --stats`: the figures, then the verdict, on stderr (stdout stays the answer)."""
    sys.stdout.flush()  # the answer's last line first, on a terminal that shows both
    print(stats_line(metrics), file=sys.stderr)
    # the probe (about 0.3 s, then cached) only where a roofline can be drawn
    bandwidth = machine_bandwidth().gb_s if metrics.implied_bandwidth_gb_s else None
    judged = verdict(metrics, bandwidth)
    if judged is not None:
        print(judged.line(), file=sys.stderr)


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
    if args.command == "compare":
        return compare.run(args)
    try:
        workspace = build_workspace(args)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if not sys.stdout.isatty() and not os.environ.get("PHASECHAT_FORCE_TUI"):
        return fail("the chat UI needs a terminal; use `phasechat ask` for headless use")
    from phasechat.tui.app import PhasechatApp

    PhasechatApp(workspace=workspace).run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
