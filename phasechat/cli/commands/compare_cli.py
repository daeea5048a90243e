"""`phasechat compare PROMPT --backend A --backend B`: the command line over chat/trips/compare.py.

N rounds (`--repeat`), interleaved A B A B ...; each metric's median and spread per side,
the ratio B/A of the medians, and a warning where the spread is wider than the
difference. Nothing is saved as a chat.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from typing import Any

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.backends.local.models import ModelNotFound
from phasechat.chat.config.file import ConfigError
from phasechat.chat.config.profiles import make_backend
from phasechat.chat.text import is_text, one_line, visible_controls
from phasechat.chat.trips.compare import (
    METRICS,
    PERCENTILE_SPREAD_FROM,
    Answer,
    Comparison,
    MetricRow,
    Side,
    aligned,
    fmt_cell,
    fmt_ratio,
    fmt_spread,
    greedy,
    metric_value,
    word_diff,
)
from phasechat.chat.trips.compare_targets import Target, derive, split_name
from phasechat.chat.turns import InputError
from phasechat.cli.commands.diverge_cli import run_chat
from phasechat.cli.commands.options import (
    add_backend_options,
    backend_spec,
    check_flags,
    fail,
    parse_chat_id,
    read_config,
    settings_from,
)
from phasechat.telemetry.records import dumps


def add_parser(sub: Any) -> None:
    """Register `compare` on the subcommand parsers `sub`."""
    p = sub.add_parser(
        "compare",
        help="the same prompt on two backends: medians, spread and B/A per metric",
        conflict_handler="resolve",  # its own --backend (given twice) replaces the shared one
        allow_abbrev=False,
    )
    add_backend_options(p, top=False)
    p.add_argument(
        "--backend",
        dest="sides",
        action="append",
        default=[],
        metavar="NAME[:key=value,...]",
        help="twice: A then B. local, openai, a config profile, or one with other settings: "
        "local:threads=1, local:flash_attn=off, local:n_ctx=2048, openai:temperature=0",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds of A then B (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument(
        "--warm",
        action="store_true",
        help="send the identical prompt every round, after one unmeasured round, so each "
        "run finds it cached (default: a fresh first line each round, a cold prefill)",
    )
    p.add_argument(
        "--together",
        action="store_true",
        help="remote backends: stream A and B of a round at once (default: one after the other)",
    )
    p.add_argument(
        "--chat",
        metavar="ID",
        help="instead of a prompt: every turn of saved chat ID, A then B, with B's "
        "divergence from A over A's answers (two settings of one local model, "
        "--backend local --backend local:kv=q4_0; or a vLLM or llama-server of the "
        "same vocabulary, over each side's top 20)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="with --chat and A the local model: also read A's answers on A a token a "
        "step, against A's own read: the engine's floor, what arithmetic alone moves",
    )
    p.add_argument("prompt", nargs="?", help="the prompt ('-' reads stdin)")


def run(args: argparse.Namespace) -> int:
    """Run `phasechat compare`; returns the exit status."""
    if len(args.sides) != 2:
        return fail("compare needs --backend twice: --backend A --backend B")
    if args.repeat < 1:
        return fail("--repeat must be 1 or more")
    if args.chat is not None:
        return _run_chat(args)
    if args.floor:
        return fail("--floor goes with --chat ID")
    if args.prompt is None:
        return fail("compare needs a prompt, or --chat ID")
    try:
        prompt = sys.stdin.buffer.read().decode() if args.prompt == "-" else args.prompt
    except UnicodeDecodeError:
        prompt = "\udcff"
    if not is_text(prompt) or not prompt.strip():
        return fail("the prompt is empty or not valid UTF-8: nothing compared")
    try:
        targets = _targets(args)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    return asyncio.run(_compare(args, prompt, targets))


def _run_chat(args: argparse.Namespace) -> int:
    """`compare --chat ID`: phasechat/cli/commands/diverge_cli.py."""
    if args.prompt is not None:
        return fail("compare takes a prompt or --chat ID, not both")
    try:
        chat_id = parse_chat_id(args.chat)
        targets = _targets(args)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    return asyncio.run(run_chat(chat_id, targets, args.json, args.floor))


def _targets(args: argparse.Namespace) -> tuple[Target, Target]:
    check_flags(args)
    config = read_config(args)
    settings = settings_from(args, config)
    out = []
    for text in args.sides:
        name, overrides = split_name(text)
        spec = backend_spec(_with_backend(args, name), config)
        out.append(derive(name, spec, settings, overrides))
    a, b = out
    if a == b:
        raise ValueError(f"A and B are the same: {a.name!r}")
    if a.name == b.name:  # two texts or files shown alike: tell them apart
        a, b = replace(a, name=f"{a.name} A"), replace(b, name=f"{b.name} B")
    return a, b


def _with_backend(args: argparse.Namespace, backend: str) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "backend": backend})


async def _compare(args: argparse.Namespace, prompt: str, targets: tuple[Target, Target]) -> int:
    ta, tb = targets
    a = make_backend(ta.spec)
    b = a if tb.spec == ta.spec else make_backend(tb.spec)
    try:
        for backend in {id(a): a, id(b): b}.values():
            await backend.start()
            if backend.state == "failed":
                return fail(f"{backend.name}: {backend.state_detail}")
        comparison = Comparison(
            Side(ta.name, a, ta.settings, _messages(ta, prompt)),
            Side(tb.name, b, tb.settings, _messages(tb, prompt)),
            _messages(ta, prompt),
            together=args.together,
            cold=not args.warm,
        )
        load_before = os.getloadavg()
        if not args.json:
            _header(comparison, args)
        try:
            await comparison.run(
                args.repeat, warm_up=args.warm, on_round=None if args.json else _round_line
            )
        except InputError as exc:
            return fail(str(exc))
        load_after = os.getloadavg()
    finally:
        await a.aclose()
        if b is not a:
            await b.aclose()
    rows = comparison.rows()
    if args.json:
        print(dumps(_record(comparison, prompt, args, rows, load_before, load_after)))
    else:
        _table(comparison, rows, load_before, load_after)
    # figures were printed; a failed run still fails the command, as `ask` does
    return 0 if all(x.complete for x in comparison.answers) else 1


def _messages(target: Target, prompt: str) -> tuple[Message, ...]:
    """A side's request: its system prompt, then its prompt (`prompt=`) or the one given."""
    system = target.settings.system
    head = (Message("system", system),) if system else ()
    return (*head, Message("user", target.prompt if target.prompt is not None else prompt))


def _backend_line(label: str, side: Side) -> str:
    return f"{label} = {one_line(side.name)} · {one_line(side.backend.model)}"


def _header(c: Comparison, args: argparse.Namespace) -> None:
    order = "together" if c.together else "interleaved A B A B ..."
    cache = "warm (identical prompt, after a warm-up round)" if args.warm else "cold each round"
    print(f"compare: {args.repeat} run(s) each, {order}, prompt cache {cache}")
    for label, side in zip("AB", c.sides, strict=True):
        print(_backend_line(label, side))


def _round_line(a: Answer, b: Answer) -> None:
    parts = []
    for label, x in (("A", a), ("B", b)):
        m = x.metrics
        assert m is not None
        if x.trace.error is not None:
            parts.append(f"{label}: error: {one_line(x.trace.error.message)}")
            continue
        burst = " (a burst: no rate)" if m.decode_unknown else ""
        parts.append(
            f"{label}: TTFT {fmt_cell(m.ttft_ms, 'ms')} ms, "
            f"decode {fmt_cell(m.decode_tok_s, '')} tok/s"
            f"{burst}, {m.output_tokens} tokens"
        )
    print(f"run {a.round + 1}: " + " | ".join(parts), flush=True)


def table_lines(rows: list[MetricRow], repeat: int) -> list[str]:
    """The figures as text: metric | A median [spread] | B median [spread] | B/A, the
    columns as wide as their widest cell needs."""
    kind = "p10-p90" if repeat >= PERCENTILE_SPREAD_FROM else "min-max"
    cells = [["metric", f"A median [{kind}]", f"B median [{kind}]", "B/A"]]
    for row in rows:
        title = f"{row.title} ({row.unit})" if row.unit not in ("%", row.title) else row.title
        ratio = fmt_ratio(row.ratio)
        cells.append([title, fmt_spread(row.a, row.unit), fmt_spread(row.b, row.unit), ratio])
    return aligned(cells, (20, 26, 26, 8))


def _table(
    c: Comparison,
    rows: list[MetricRow],
    before: tuple[float, float, float],
    after: tuple[float, float, float],
) -> None:
    print("\n" + "\n".join(table_lines(rows, c.repeat)))
    for row in rows:
        warning = row.warning()
        if warning:
            print(f"warning: {warning}")
    for x in c.answers:
        if x.trace.error is not None:
            label = "AB"[x.side]
            print(f"{label} run {x.round + 1} failed: {visible_controls(x.trace.error.message)}")
    a, b = c.latest(0), c.latest(1)
    if greedy(c) and a is not None and b is not None:
        same = a.text == b.text
        print("answers (temperature 0, seeded): " + ("identical" if same else "B against A,"))
        if not same:
            print(one_line(word_diff(a.text, b.text)))
    else:
        for label, side in zip("AB", (0, 1), strict=True):
            first = c.latest(side)
            if first is not None and first.text:
                shown = one_line(first.text)
                print(f"{label} said (last run): {shown[:100]}{'…' if len(shown) > 100 else ''}")
    print(f"load average (1, 5, 15 min): before {_load(before)}, after {_load(after)}")


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def _record(
    c: Comparison,
    prompt: str,
    args: argparse.Namespace,
    rows: list[MetricRow],
    before: tuple[float, float, float],
    after: tuple[float, float, float],
) -> dict[str, Any]:
    sides = []
    for n, side in enumerate(c.sides):
        runs: list[dict[str, Any]] = []
        for x in c.of(n):
            m = x.metrics
            assert m is not None
            runs.append(
                {
                    "round": x.round + 1,
                    "text": x.text,
                    "error": x.trace.error.message if x.trace.error else None,
                    **{key: metric_value(m, key) for key, _, _ in METRICS},
                    "prompt_tokens": m.prompt_tokens,
                    "cached_tokens": m.cached_tokens,
                    "output_tokens": m.output_tokens,
                    "finish": m.finish,
                }
            )
        stats = {
            row.key: {
                "median": (s := (row.a, row.b)[n]).median,
                "lo": s.lo,
                "hi": s.hi,
                "n": s.n,
            }
            for row in rows
        }
        sides.append(_side_record(side, runs, stats))
    return {
        "prompt": prompt,
        "repeat": args.repeat,
        "order": "together" if c.together else "interleaved",
        "cache": "warm" if args.warm else "cold",
        "spread": "p10-p90" if args.repeat >= PERCENTILE_SPREAD_FROM else "min-max",
        "sides": sides,
        "ratio": {row.key: row.ratio for row in rows},
        "delta": {row.key: row.delta for row in rows},
        "warnings": [w for row in rows if (w := row.warning())],
        "answer_diff": _diff(c),
        "loadavg_before": list(before),
        "loadavg_after": list(after),
    }


def _diff(c: Comparison) -> str | None:
    """B's last answer against A's, word by word, when both decode deterministically."""
    a, b = c.latest(0), c.latest(1)
    if not greedy(c) or a is None or b is None:
        return None
    return word_diff(a.text, b.text)


def _side_record(side: Side, runs: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    backend: Backend = side.backend
    return {
        "name": side.name,
        "model": backend.model,
        "temperature": side.settings.temperature,
        "system": side.messages[0].content
        if side.messages and side.messages[0].role == "system"
        else None,
        "max_tokens": side.settings.max_tokens,
        "runs": runs,
        "stats": stats,
    }
