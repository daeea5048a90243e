"""Prompt anatomy on the bundled model: a 10-turn chat's last prompt by section, then
three edits of it (the last question, question 2, the system prompt; after each, the
chat goes back to the 10-turn branch, while the engine holds the edit), each forecast before it
is sent (`expect`, what the dry run and the edit's forecast line say) and then sent.

Run alone (llama.cpp's threads spin-wait: a busy neighbour slows every figure):
    .venv/bin/python -m bench.edit_forecast [--n-ctx 4096] [--max-tokens 48]

Printed: the load average beside the figures, the last turn's section table, and per
edit the forecast and the actual cached / read tokens and TTFT, and the forecast's error
((forecast - actual) / actual).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.chat.config.settings import Settings
from phasechat.chat.costs import expect
from phasechat.chat.engine_held import name_of
from phasechat.chat.turns import Exchange, TurnController
from phasechat.telemetry.anatomy import Anatomy
from phasechat.telemetry.metrics import Metrics

SYSTEM = "You are a patient tutor. Answer in two or three sentences, plainly."
QUESTIONS = (
    "What is a lighthouse?",
    "Where are lighthouses usually built?",
    "Who kept them in the past?",
    "How did the light reach so far?",
    "What is a Fresnel lens?",
    "Why did some lighthouses use colours?",
    "How were they powered before electricity?",
    "What replaced lighthouse keepers?",
    "Are lighthouses still useful with GPS?",
    "Name one famous lighthouse and say why it is famous.",
)
EDITS = (
    ("the last question", "Name two famous lighthouses."),
    ("question 2", "Where are lighthouses built, and why there?"),
    ("the system prompt", "You are a terse tutor. Answer in one sentence."),
)


async def turn(turns: TurnController, exchange: Exchange) -> Exchange:
    await turns.run(exchange)
    return exchange


def figures(m: Metrics) -> dict[str, object]:
    """What the forecast is fitted on, and what it forecasts, for one read."""
    return {
        "new": m.server_prompt_n,
        "cached": m.server_cache_n,
        "engine_ms": m.server_prompt_ms,
        "ttft_ready_ms": m.ttft_ready_ms,
    }


def table(anatomy: Anatomy) -> str:
    rows = [
        f"| {'section':<15} | tokens | cached | read | prefill ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in anatomy.sections:
        ms = "-" if s.prefill_ms is None else f"{s.prefill_ms:.1f}"
        name = name_of(s.kind, s.message_index)
        rows.append(
            f"| {name:<15} | {s.tokens} | {s.cached_tokens} | {s.evaluated_tokens} | {ms} |"
        )
    rows.append(f"| the prompt | {anatomy.prompt_tokens} | | | |")
    return "\n".join(rows)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--dump", metavar="FILE", help="write each read's engine figures as JSON")
    args = p.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    backend = LocalBackend(LocalConfig(model_path=default_model_path(), n_ctx=args.n_ctx))
    await backend.start()
    if backend.state != "ready":
        print(f"model failed to load: {backend.state_detail}", file=sys.stderr)
        return 2
    settings = Settings(system=SYSTEM, max_tokens=args.max_tokens, temperature=0.0, seed=1)
    turns = TurnController(backend, settings)
    try:
        for q in QUESTIONS:
            done = await turn(turns, turns.begin(q))
            m = done.metrics
            assert m is not None
            print(
                f"turn {len(turns.exchanges):2}: prompt {m.prompt_tokens} cached {m.cached_tokens}"
                f" TTFT {m.ttft_ms:.0f} ms"
            )
        reads = [figures(x.metrics) for x in turns.exchanges if x.metrics is not None]
        last = turns.exchanges[-1].anatomy
        assert last is not None
        print(f"\nthe last turn's prompt ({last.source}):\n{table(last)}\n")
        print(
            "| edit | forecast keeps / reads | actual keeps / reads | forecast TTFT | actual TTFT"
            " | error |"
        )
        print("|---|---|---|---:|---:|---:|")
        for what, text in EDITS:
            questions = turns.conversation.questions()
            target = {
                "the last question": questions[-1].id,
                "question 2": questions[1].id,
                "the system prompt": turns.conversation.root.id,
            }[what]
            e = expect(turns, turns.preview(text, target))
            if what == "the system prompt":
                exchange = turns.edit_system(text)
            else:
                exchange = turns.edit(target, text)
            assert exchange is not None
            m = (await turn(turns, exchange)).metrics
            assert m is not None and m.ttft_ms is not None
            # back to the 10-turn branch for the next edit (the engine holds this one)
            edited = turns.conversation.root if what == "the system prompt" else exchange.user
            turns.show_sibling(edited.id, -1)
            reads.append({"edit": what, "forecast_ms": e.ttft_ms, **figures(m)})
            forecast = "-" if e.ttft_ms is None else f"{e.ttft_ms:.0f} ms"
            error = "-" if e.ttft_ms is None else f"{(e.ttft_ms - m.ttft_ms) / m.ttft_ms:+.0%}"
            print(
                f"| {what} | {e.cached_tokens} / {e.evaluated_tokens} | {m.cached_tokens} / "
                f"{m.evaluated_prompt_tokens} | {forecast} | {m.ttft_ms:.0f} ms | {error} |"
            )
    finally:
        await backend.aclose()
    if args.dump:
        await asyncio.to_thread(Path(args.dump).write_text, json.dumps(reads, indent=1))
    print(f"\nload after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
