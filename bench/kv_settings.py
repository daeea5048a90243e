"""Engine settings on a real chat (issue 39): a 10-turn chat written by the bundled
model and saved (in a temporary data directory, never the user's), then
`phasechat compare --chat ID --backend local --backend local:X` for each setting X: by
default the KV types kv=f16 (the check: KL 0), kv=q8_0 and kv=q4_0; `--variant` names
others (`draft=lookup`, `draft=PATH`, `model=PATH`, `flash_attn=on`, ...), and
`--server URL` a vLLM or llama-server of the same model as B (its KL over each side's top
20: a lower bound, marked ">="). `--floor` adds the engine's floor: A against itself,
read a token a step (what the order of the sums alone moves).

Run alone (llama.cpp's threads spin-wait: a busy neighbour slows the speed columns; the
divergence columns do not depend on the machine):
    .venv/bin/python -m bench.kv_settings [--max-tokens 48] [--threads 2] [--variant X ...]
        [--server URL [--model NAME]]

Printed: per setting B, the bytes a token takes in each side's KV cache and what it held
at the end of the chat (MiB), the prefill and decode rates (medians over the turns,
beside A's), the draft's accepted/proposed tokens (a draft side), in how many turns B
wrote A's answer token for token, and B's divergence from A over A's answers: KL mean
and max, top-1 agreement, the first divergence (turn and token); "n/a" where no
divergence was measured (another vocabulary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from bench.edit_forecast import QUESTIONS, SYSTEM
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.chat.config.settings import Settings
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.writer import follow
from phasechat.chat.turns import TurnController

SETTINGS = ("kv=f16", "kv=q8_0", "kv=q4_0")


async def write_chat(max_tokens: int, threads: int) -> int:
    """The 10-turn chat, answered by the bundled model (greedy) and saved; its id."""
    backend = LocalBackend(LocalConfig(model_path=default_model_path(), threads=threads))
    await backend.start()
    settings = Settings(system=SYSTEM, max_tokens=max_tokens, temperature=0.0, seed=1)
    turns = TurnController(backend, settings)
    try:
        with ChatStore() as store:
            chat = store.create_chat()
            follow(turns, store, chat)
            for question in QUESTIONS:
                await turns.run(turns.begin(question))
    finally:
        await backend.aclose()
    return chat


def compare(chat: int, b: list[str], max_tokens: int, threads: int, floor: bool) -> dict[str, Any]:
    """`compare --chat` with A the local model and B `b` (a --backend and its options);
    `floor`: with the engine's floor (A read a token a step)."""
    cmd = [sys.executable, "-m", "phasechat", "compare", "--chat", str(chat), "--json"]
    cmd += ["--floor"] if floor else []
    cmd += ["--backend", "local", "--backend", *b, "--temperature", "0"]
    cmd += ["--max-tokens", str(max_tokens), "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"compare failed: {r.stderr.strip()}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rates(out: dict[str, Any], side: str, key: str, digits: int) -> str:
    known = [t[side][key] for t in out["turns"] if t[side][key] is not None]
    return f"{median(known):.{digits}f}" if known else "n/a"


def count(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def first_divergence(out: dict[str, Any]) -> str:
    for t in out["turns"]:
        d = t["divergence"]
        if d is not None and d["first_divergence"] is not None:
            return f"turn {t['turn']}, token {d['first_divergence'] + 1}"
    return "none"


def drafted(out: dict[str, Any]) -> str:
    """B's draft tokens accepted of those proposed over the chat ("-": no draft)."""
    proposed = sum(t["b"]["draft_n"] or 0 for t in out["turns"])
    accepted = sum(t["b"]["draft_accepted"] or 0 for t in out["turns"])
    return f"{accepted}/{proposed} ({accepted / proposed:.0%})" if proposed else "-"


def same_answers(out: dict[str, Any]) -> str:
    """In how many turns B wrote A's answer token for token."""
    same = [t["same_answer"] for t in out["turns"] if t["same_answer"] is not None]
    return f"{sum(same)}/{len(same)}" if same else "n/a"  # a server sends no token ids


def divergence_cells(out: dict[str, Any]) -> str:
    d = out["divergence"]
    if d is None:
        return "n/a | n/a | n/a | n/a"
    bound = ">=" if d["top_k"] is not None else ""  # over each side's top k
    return (
        f"{bound}{d['kl_mean']:.5f} | {bound}{d['kl_max']:.4f} | {d['top1_agreement']:.1%} | "
        f"{first_divergence(out)}"
    )


def floor_cell(out: dict[str, Any]) -> str:
    """The engine's floor over the chat: A against itself read a token a step."""
    f = out["floor"]
    if f is None:
        return "n/a"
    return f"{f['kl_mean']:.5f} / {f['kl_max']:.4f}, {f['top1_agreement']:.1%}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variant", action="append", help="a setting of B (key=value); repeatable")
    p.add_argument("--server", help="B: a vLLM or llama-server at this URL, after the variants")
    p.add_argument("--model", help="the model to ask --server for")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also A against itself read a token a step (the engine's floor), a last column",
    )
    args = p.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory() as data:
        os.environ["XDG_DATA_HOME"] = data  # the chat is saved here, and read by compare
        chat = asyncio.run(write_chat(args.max_tokens, args.threads))
        print(f"chat {chat}: {len(QUESTIONS)} turns written by the bundled model, greedy\n")
        print(
            "| B | KV B/token (A / B) | KV MiB (A / B) | prefill tok/s (A / B) | decode tok/s"
            " (A / B) | draft accepted | B's answers = A's | KL mean | KL max | top-1 |"
            " first divergence |" + (" floor: KL mean / max, top-1 |" if args.floor else "")
        )
        print(
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            + ("---|" if args.floor else "")
        )
        sides = [(v, ["local:" + v]) for v in args.variant or ([] if args.server else SETTINGS)]
        if args.server:
            model = ["--model", args.model] if args.model else []
            sides.append((f"server {args.server}", ["openai", "--base-url", args.server, *model]))
        for variant, b in sides:
            out = compare(chat, b, args.max_tokens, args.threads, args.floor)
            per_a, per_b = out["kv_bytes_per_token"]
            kv_a, kv_b = out["kv_mib"]
            key, _, value = variant.partition("=")
            shown = f"{key}={value.rsplit('/', 1)[-1]}" if value else key  # a file by its name
            prefill = " / ".join(rates(out, side, "prefill_tok_s", 0) for side in ("a", "b"))
            decode = " / ".join(rates(out, side, "decode_tok_s", 1) for side in ("a", "b"))
            print(
                f"| {shown} | {count(per_a, ',')} / {count(per_b, ',')} | "
                f"{count(kv_a, '.2f')} / {count(kv_b, '.2f')} | {prefill} | {decode} | "
                f"{drafted(out)} | {same_answers(out)} | {divergence_cells(out)} |"
                + (f" {floor_cell(out)} |" if args.floor else ""),
                flush=True,
            )
    print(f"\nload after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
