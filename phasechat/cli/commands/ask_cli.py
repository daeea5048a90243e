"""`phasechat ask PROMPT`: one answer, headless, through the same turn controller as the UI.

With `--chat ID` it continues a saved chat (the prompt goes after the message the chat
shows last); `--edit N` asks PROMPT instead of question N of that branch (1 = its first),
on a new branch; `--system TEXT` with `--chat` gives the chat a new system prompt, on a
new branch from its root. The old branches stay in the chat.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from typing import Any

from phasechat.backends.events import TextDelta
from phasechat.backends.local.models import ModelNotFound
from phasechat.chat.config.file import ConfigError
from phasechat.chat.costs import expect, held_prefix
from phasechat.chat.roofline import ceilings
from phasechat.chat.store.database import ChatNotFound, StoreError
from phasechat.chat.text import is_text, one_line, visible_controls
from phasechat.chat.turns import Exchange, InputError
from phasechat.chat.workspace import Workspace
from phasechat.cli.commands.options import add_backend_options, build_workspace, fail, parse_chat_id
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.records import dumps
from phasechat.telemetry.verdict import engine_says, stats_line, verdict
from phasechat.telemetry.waterfall import waterfall_of


def add_parser(sub: Any) -> None:
    """Register `ask` on the subcommand parsers `sub`."""
    ask = sub.add_parser("ask", help="answer one prompt on stdout (headless)", allow_abbrev=False)
    add_backend_options(ask, top=False)
    ask.add_argument("--json", action="store_true", help="print one JSON object instead")
    ask.add_argument("--no-save", action="store_true", help="do not save the exchange as a chat")
    ask.add_argument(
        "--stats",
        action="store_true",
        help="after the answer, its figures and the verdict (which phase ate the time) on stderr",
    )
    ask.add_argument(
        "--chat",
        metavar="ID",
        help="continue saved chat ID: the prompt goes after the message it shows last "
        "(with --system: a new branch with that system prompt)",
    )
    ask.add_argument(
        "--edit",
        metavar="N",
        type=int,
        help="with --chat: ask PROMPT instead of question N of the chat's branch "
        "(1 = its first), on a new branch; the old one stays",
    )
    ask.add_argument(
        "--dry-run",
        action="store_true",
        help="send nothing: say what the prompt would cost (its tokens, what the engine "
        "holds of it, the TTFT that implies), with --json as one object",
    )
    ask.add_argument("prompt", help="the prompt ('-' reads stdin)")


async def run(args: argparse.Namespace) -> int:
    """Stream one answer to stdout, or print one JSON object with --json."""
    try:
        prompt = sys.stdin.buffer.read().decode() if args.prompt == "-" else args.prompt
    except UnicodeDecodeError:
        prompt = "\udcff"  # refused below like an argument that is not UTF-8
    if not is_text(prompt):
        # Before anything is created: no empty chat is left behind.
        return fail("the prompt is not valid UTF-8: nothing asked, nothing saved")
    chat_id: int | None = None
    if args.chat is not None:
        try:
            chat_id = parse_chat_id(args.chat)
        except ValueError as exc:
            return fail(str(exc))
    elif args.edit is not None:
        return fail("--edit needs --chat ID: the saved chat whose question N is edited")
    try:
        workspace = build_workspace(args, all_backends=False)
    except (ConfigError, ModelNotFound, OSError, ValueError) as exc:
        return fail(str(exc))
    turns, backend = workspace.turns, workspace.backend
    try:
        if not prompt.strip():
            raise InputError("empty prompt: nothing to ask")
        if chat_id is not None:
            _open(workspace, chat_id, args)  # before the model loads: a bad id fails fast
            _question(workspace, args.edit)  # and so does a bad --edit N
        await backend.start()
        if backend.state == "failed":
            return fail(backend.state_detail)
        if args.dry_run:
            return await _dry_run(workspace, args, prompt)
        if chat_id is None and not args.no_save:
            for line in workspace.open_store():
                print(f"phasechat: warning: {visible_controls(line)}", file=sys.stderr)
            error = workspace.ensure_chat()
            if error:
                print(f"phasechat: warning: {visible_controls(error)}", file=sys.stderr)
        exchange = _begin(workspace, args.edit, prompt)
        out = sys.stdout
        async for event in turns.run(exchange):
            if isinstance(event, TextDelta) and event.text and not args.json:
                out.write(visible_controls(event.text))
                out.flush()
    except (InputError, ChatNotFound, StoreError, sqlite3.Error) as exc:
        return fail(str(exc))
    finally:
        store = workspace.store
        if store is not None and store.error:
            print(f"phasechat: warning: {visible_controls(store.error)}", file=sys.stderr)
        await workspace.aclose()
        tracing = workspace.tracing  # closed: the last batch was sent, or refused
        if tracing is not None:
            last = [tracing.problem] if tracing.problem else []
            for line in tracing.notes + last:  # our words, never the SDK's own text
                print(f"phasechat: warning: {visible_controls(line)}", file=sys.stderr)
    metrics = exchange.metrics
    assert metrics is not None
    if args.json:
        print(dumps(_record(workspace, exchange, metrics)))
    elif exchange.answer.content and not exchange.answer.content.endswith("\n"):
        print()
    sys.stdout.flush()
    for line in exchange.trace.notices:  # e.g. a server's numbers that were not believed
        print(f"phasechat: note: {visible_controls(line)}", file=sys.stderr)
    if args.stats:
        print_stats(metrics)
    if exchange.answer.status == "error":
        return fail(exchange.answer.error or "the answer failed", 1)
    return 0


def _open(workspace: Workspace, chat_id: int, args: argparse.Namespace) -> None:
    """Continue saved chat `chat_id` (saved as it goes, unless --no-save), with the
    system prompt --system names (a new branch) or else the chat's own."""
    if args.no_save or args.dry_run:
        workspace.open_store(readonly=True)
    else:
        for line in workspace.open_store():
            print(f"phasechat: warning: {visible_controls(line)}", file=sys.stderr)
    if workspace.store is None:
        raise StoreError("the chat database cannot be opened (see above)")
    saved = workspace.open_chat(chat_id, save=not (args.no_save or args.dry_run))
    for line in saved.unreadable:  # the rest of the chat goes on
        print(f"phasechat: warning: {one_line(line)}", file=sys.stderr)
    if getattr(args, "system", None) is not None:
        workspace.turns.update_settings(system=args.system)


def _begin(workspace: Workspace, edit: int | None, prompt: str) -> Exchange:
    """The turn asked for: PROMPT after the leaf, or instead of question `edit`."""
    turns = workspace.turns
    question = _question(workspace, edit)
    return turns.begin(prompt) if question is None else turns.edit(question, prompt)


def _question(workspace: Workspace, edit: int | None) -> int | None:
    """The id of question `edit` (1 = the first) of the branch shown; None for none."""
    if edit is None:
        return None
    questions = workspace.turns.conversation.questions()
    if not 1 <= edit <= len(questions):
        chat = workspace.chat_id()
        raise InputError(
            f"no question {edit} in chat {chat}: its branch has {len(questions)} (1 is the first)"
        )
    return questions[edit - 1].id


async def _dry_run(workspace: Workspace, args: argparse.Namespace, prompt: str) -> int:
    """`ask --dry-run`: what sending would cost; nothing is sent or saved."""
    turns = workspace.turns
    messages = turns.preview(prompt, _question(workspace, args.edit))
    # a server: what it still holds of this chat, by its own tokenizer (llama-server)
    expected = expect(turns, messages, await held_prefix(turns, messages))
    if not args.json:
        print(f"{expected.prompt_tokens:,} prompt tokens: {expected.line()}")
        return 0
    record = {
        "dry_run": True,
        "chat_id": parse_chat_id(args.chat) if args.chat is not None else None,
        "prompt_tokens": expected.prompt_tokens,
        "expected_cached_tokens": expected.cached_tokens,
        "expected_evaluated_tokens": expected.evaluated_tokens,
        "expected_ttft_ms": expected.ttft_ms,
        "estimated": expected.estimated,
    }
    print(dumps(record))
    return 0


def _record(workspace: Workspace, exchange: Exchange, metrics: Metrics) -> dict[str, Any]:
    """`ask --json`'s object: the text, every metric, where it was saved and on which
    branch, and when each token came."""
    answer, question = exchange.answer, exchange.user
    conversation = workspace.turns.conversation
    record: dict[str, Any] = {"text": answer.content, "reasoning": answer.reasoning}
    record.update(metrics.as_dict())
    chat_id = workspace.chat_id()
    if chat_id is not None:
        record["chat_id"] = chat_id
        record["message_id"] = workspace.row_of(answer)
        record["parent_id"] = workspace.row_of(question)
    anatomy = exchange.anatomy
    record.update(
        anatomy.as_dict()
        if anatomy is not None
        else {"prompt_sections": None, "sections_source": None, "cache_break": None}
    )
    record["branch"] = _branch(conversation.branch_of(answer))
    record["question_branch"] = _branch(conversation.branch_of(question))
    record["token_times_ms"] = exchange.token_times_ms()
    found = waterfall_of(metrics)  # a remote answer's wait, part by part
    record["waterfall"] = found.as_dict() if found is not None else None
    return record


def _branch(position: tuple[int, int]) -> dict[str, int]:
    index, count = position
    return {"index": index, "of": count}


def print_stats(metrics: Metrics) -> None:
    """`ask --stats`: the figures, then the verdict, on stderr (stdout stays the answer)."""
    sys.stdout.flush()  # the answer's last line first, on a terminal that shows both
    print(stats_line(metrics), file=sys.stderr)
    if says := engine_says(metrics):
        print(one_line(says), file=sys.stderr)
    if (wait := waterfall_of(metrics)) is not None:
        print(one_line(wait.line()), file=sys.stderr)
    # the probes (about a second, then cached) only where a roofline can be drawn
    found = ceilings(metrics)
    if found.notice is not None:  # a damaged bandwidth.json, ignored
        print(f"phasechat: note: {visible_controls(found.notice)}", file=sys.stderr)
    judged = verdict(metrics, found.cpu_gb_s, found.cpu_label, found.gpu_gb_s, found.gpu_label)
    if judged is not None:
        print(judged.line(), file=sys.stderr)
