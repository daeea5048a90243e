"""History tokens read again per turn: a 10-turn chat on the bundled model, sampled.

Run: .venv/bin/python bench/history_reread.py [--seed 1] [--turns 10] [--n-ctx 4096]
[--threads 2]

One chat through the turn controller (the default sampling: temperature 0.7, up to 512
tokens, a fixed seed; no trimming), as the UI sends it. Per turn, printed: the prompt's
tokens, what the engine held before it (the last prompt and answer: its KV cache), how
many of those it reused, how many of them it read again (held - cached: the history
re-read), how many were new (the new message and the template's tail), how many it
would have read again had the history gone as text, tokenized again (`as-text`: the last
answer's ids as sampled against the tokens of its text in this prompt), how the last
answer ended, and the cache break the turn reports. A sampled answer that the tokenizer
splits otherwise when its text is tokenized again is re-read from that token on
(docs/editing.md, "Token-exact history").

To compare with the code before a change, run this file with PYTHONPATH set to that
checkout (the path below is only added when phasechat cannot be imported).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

try:
    import phasechat  # noqa: F401
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from phasechat.backends.events import GenerationRequest, Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController

PROMPTS = (
    "Explain the KV cache in one paragraph.",
    "Name three colors.",
    "Why is the sky blue?",
    "Write a haiku about tokens.",
    "What is prefill, in two sentences?",
    "Give me a tip for learning Python.",
    "What does a GPU do that a CPU does not?",
    "Summarise our chat so far in one line.",
    "Tell me a fact about octopuses.",
    "Say goodbye in French and in German.",
)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="a fixed thread count: the same seed then gives the same answers run after "
        "run (default: adaptive, whose changes alter the sums)",
    )
    args = p.parse_args()
    backend = LocalBackend(LocalConfig(n_ctx=args.n_ctx, threads=args.threads))
    await backend.start()
    if backend.state != "ready":
        print(f"model not ready: {backend.state_detail}", file=sys.stderr)
        return 1
    turns = TurnController(backend, Settings(seed=args.seed), trim=False)
    held, last_prompt, last_plain = 0, 0, 0
    last_answer: tuple[int, ...] = ()
    reread_total, reread_turns, last_finish = 0, 0, "-"
    print(f"seed {args.seed}, temperature {turns.settings.temperature}, n_ctx {args.n_ctx}")
    print("turn  prompt  held  cached  re-read  new  as-text  last-answer-end  break")
    as_text_total, as_text_turns = 0, 0
    for i, prompt in enumerate(PROMPTS[: args.turns] * (1 + args.turns // len(PROMPTS))):
        if i >= args.turns:
            break
        exchange = turns.begin(prompt)
        as_text = 0
        if exchange.request is not None and last_answer:
            plain = _plain(backend, exchange.request)
            as_text = _as_text(plain, last_plain, last_answer, held - last_prompt)
        as_text_total += as_text
        as_text_turns += as_text > 0
        await turns.run(exchange)
        trace, m = exchange.trace, exchange.metrics
        if trace.prompt is None or m is None or trace.kv is None:
            print(f"{i + 1:>4}  failed: {trace.error}")
            return 1
        cached = trace.prompt.cached_tokens
        reread = max(0, held - cached)
        reread_total += reread
        reread_turns += reread > 0
        anatomy = exchange.anatomy
        brk = anatomy.cache_break.line() if anatomy and anatomy.cache_break else "-"
        print(
            f"{i + 1:>4}  {trace.prompt.prompt_tokens:>6}  {held:>4}  {cached:>6}  "
            f"{reread:>7}  {trace.prompt.prompt_tokens - held:>3}  {as_text:>7}  "
            f"{last_finish:<15}  {brk}"
        )
        held, last_finish = trace.kv.used_tokens, f"{trace.finish} ({m.output_tokens})"
        assert exchange.request is not None
        last_prompt, last_plain = trace.prompt.prompt_tokens, len(_plain(backend, exchange.request))
        # getattr: the code before token-exact history (to compare with) has no ids
        tokens = getattr(exchange.answer, "tokens", None)
        last_answer = tokens.ids if tokens is not None else ()
    print(f"history tokens read again: {reread_total} in {reread_turns} of {args.turns} turns")
    print(f"had it gone as text: {as_text_total} in {as_text_turns} of {args.turns} turns")
    await backend.aclose()
    return 0


def _plain(backend: LocalBackend, request: GenerationRequest) -> list[int]:
    """`request`'s prompt with every answer as text, tokenized again (no ids spliced)."""
    return backend.format_prompt(tuple(Message(m.role, m.content) for m in request.messages))[0]


def _as_text(plain: list[int], before: int, answer: tuple[int, ...], held: int) -> int:
    """Of the last answer's `held` tokens in the KV cache (its ids as sampled), how many
    an engine sent the history as text would read again: the answer's ids against the
    tokens of its text in the next prompt (`plain`, after the `before` tokens of the
    last prompt). Earlier answers were read again, if at all, in their own next turn."""
    common = 0
    for a, b in zip(answer, plain[before:], strict=False):
        if a != b:
            break
        common += 1
    return max(0, held - common)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
