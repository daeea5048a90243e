"""The `phasechat` command: the TUI by default; the headless verbs (`ask`, `chats`,
`endpoints`, `bench`, `compare`, `ablate`, `doctor`) each in a module of its own.

Nothing here imports Textual unless the TUI is started, so `ask` and `doctor` start fast
and work without a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from phasechat.backends.local import llama_logs
from phasechat.backends.local.models import ModelNotFound
from phasechat.chat.config.file import ConfigError
from phasechat.chat.text import one_line
from phasechat.cli.commands import (
    ablate_cli,
    ask_cli,
    bench_cli,
    chats_cli,
    compare_cli,
    endpoints_cli,
)
from phasechat.cli.commands.options import add_backend_options, build_workspace, fail


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phasechat",
        # no prefixes: `ask --chat 1` must not be read as `--chat-format 1`
        allow_abbrev=False,
        description="Chat with an LLM and see where the time goes: prefill vs decode.",
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print phasechat's version and the llama.cpp build (no model is loaded), then exit",
    )
    add_backend_options(parser)
    sub = parser.add_subparsers(dest="command")
    ask_cli.add_parser(sub)
    chats_cli.add_parser(sub)
    endpoints_cli.add_parser(sub)
    bench_p = sub.add_parser(
        "bench", help="replay a scripted chat: prefill and cache per turn", allow_abbrev=False
    )
    add_backend_options(bench_p, top=False)
    bench_cli.add_options(bench_p)
    compare_cli.add_parser(sub)
    ablate_cli.add_parser(sub)
    sub.add_parser(
        "doctor", help="llama.cpp build, GPU offload and the default model", allow_abbrev=False
    )
    return parser


def doctor(args: argparse.Namespace) -> int:
    """Print the llama.cpp build, the GPU and the default model's geometry."""
    from phasechat.cli.commands.doctor import report

    print(report(args.gpu_layers))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `phasechat doctor | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        # Ctrl+C: asyncio.run cancelled the verb, whose `finally` saved what it had (an
        # answer cut short is kept, marked cancelled); then it raises this. One line.
        if sys.stdout.isatty():  # the answer cut mid-line: the note goes on a line of its own
            print(flush=True)
        return fail("interrupted", 130)
    except Exception as exc:  # a defect: one line and a failure, never a traceback
        # (each verb saves as it goes and closes its store in `finally`)
        return fail(one_line(f"internal error: {type(exc).__name__}: {exc}")[:400], 1)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    # before anything touches llama.cpp: its log lines stay off stderr unless asked for
    llama_logs.set_verbose(bool(getattr(args, "verbose", False)))
    if args.version:
        from phasechat.cli.commands.build_info import version_text

        print(version_text())
        return 0
    if args.command == "ask":
        return asyncio.run(ask_cli.run(args))
    if args.command == "doctor":
        return doctor(args)
    if args.command == "chats":
        return chats_cli.run(args)
    if args.command == "endpoints":
        return endpoints_cli.run(args)
    if args.command == "bench":
        return bench_cli.run(args)
    if args.command == "compare":
        return compare_cli.run(args)
    if args.command == "ablate":
        return ablate_cli.run(args)
    try:
        workspace = build_workspace(args, own_process=True)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if not sys.stdout.isatty() and not os.environ.get("PHASECHAT_FORCE_TUI"):
        return fail("the chat UI needs a terminal; use `phasechat ask` for headless use")
    from phasechat.tui.app import PhasechatApp

    app = PhasechatApp(workspace=workspace)
    app.run()
    tracing = workspace.tracing  # closed at the app's exit: the one thing left to say
    if tracing is not None and tracing.dropped:
        print(f"phasechat: warning: {one_line(tracing.dropped)}", file=sys.stderr)
    return app.return_code or 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
