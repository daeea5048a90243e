"""The `phasechat` command: the TUI by default, plus headless `ask` and `doctor`.

Nothing here imports Textual unless the TUI is started, so `ask` and `doctor` start fast
and work without a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

from backends.events import TextDelta
from backends.local import LocalConfig
from backends.models import ModelNotFound
from backends.openai import RemoteConfig
from chat.profiles import BackendSpec, make_backend, resolve_model_path
from chat.session import ChatSession, InputError, Settings
from chat.text import visible_controls


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("backend")
    g.add_argument("--backend", choices=["local", "openai"], default="local")
    g.add_argument(
        "--model",
        help="local: a GGUF path or a bundled alias (smollm2, gemma3); openai: the model name",
    )
    g.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="openai: endpoint")
    g.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="openai: the environment variable that holds the API key",
    )
    g.add_argument("--n-ctx", type=int, default=4096, help="local: context size in tokens")
    g.add_argument(
        "--gpu-layers",
        type=int,
        default=None,
        help="local: layers to offload to the GPU (-1 all; default all if the build can)",
    )
    g.add_argument("--threads", type=int, default=None, help="local: default physical cores")
    g.add_argument("--chat-format", default=None, help="local: override the chat template")
    e = p.add_argument_group("engine")
    e.add_argument("--system", default=Settings().system, help="the system prompt")
    e.add_argument("--max-tokens", type=int, default=Settings().max_tokens)
    e.add_argument("--temperature", type=float, default=Settings().temperature)
    e.add_argument("--seed", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phasechat",
        description="Chat with an LLM and see where the time goes: prefill vs decode.",
    )
    _add_backend_options(parser)
    sub = parser.add_subparsers(dest="command")
    ask = sub.add_parser("ask", help="answer one prompt on stdout (headless)")
    _add_backend_options(ask)
    ask.add_argument("--json", action="store_true", help="print one JSON object instead")
    ask.add_argument("prompt", help="the prompt ('-' reads stdin)")
    sub.add_parser("doctor", help="llama.cpp build, GPU offload and the default model")
    return parser


def backend_spec(args: argparse.Namespace) -> BackendSpec:
    """The backend the parsed options describe (may raise ModelNotFound)."""
    local = LocalConfig(
        model_path=resolve_model_path(args.model) if args.backend == "local" else None,
        n_ctx=args.n_ctx,
        n_gpu_layers=args.gpu_layers,
        threads=args.threads,
        chat_format=args.chat_format,
    )
    remote = RemoteConfig(
        base_url=args.base_url,
        model=args.model if args.backend == "openai" else None,
        api_key_env=args.api_key_env,
    )
    return BackendSpec(args.backend, local, remote)


def settings(args: argparse.Namespace) -> Settings:
    return Settings(
        system=args.system,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )


def fail(message: str, code: int = 2) -> int:
    print(f"phasechat: {visible_controls(message)}", file=sys.stderr)
    return code


async def ask(args: argparse.Namespace) -> int:
    """Stream one answer to stdout, or print one JSON object with --json."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        spec = backend_spec(args)
    except (ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    backend = make_backend(spec)
    session = ChatSession(backend, settings(args))
    try:
        if not prompt.strip():
            raise InputError("empty prompt: nothing to ask")
        await backend.start()
        if backend.state == "failed":
            return fail(backend.state_detail)
        out = sys.stdout
        async for event in session.send(prompt):
            if isinstance(event, TextDelta) and event.text and not args.json:
                out.write(visible_controls(event.text))
                out.flush()
    except InputError as exc:
        return fail(str(exc))
    finally:
        await backend.aclose()
    exchange = session.exchanges[-1]
    metrics = exchange.metrics
    assert metrics is not None
    if args.json:
        record = {"text": exchange.answer.content, **metrics.as_dict()}
        record["token_times_ms"] = [t / 1e6 for t in exchange.trace.times]
        print(json.dumps(record, ensure_ascii=False))
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
    args = build_parser().parse_args(argv)
    if args.command == "ask":
        return asyncio.run(ask(args))
    if args.command == "doctor":
        return doctor()
    try:
        spec = backend_spec(args)
    except (ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    if not sys.stdout.isatty() and not os.environ.get("PHASECHAT_FORCE_TUI"):
        return fail("the chat UI needs a terminal; use `phasechat ask` for headless use")
    from tui.app import PhasechatApp

    PhasechatApp(spec, settings(args)).run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
