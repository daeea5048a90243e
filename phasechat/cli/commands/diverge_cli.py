"""`phasechat compare --chat ID --backend A --backend B`: a saved chat, every turn, on two
sides (chat/trips/diverge.py): each side's phases per turn, the KV cache each holds, and
B's divergence from A over A's answers, teacher-forced.

    phasechat compare --chat 3 --backend local --backend local:kv=q4_0 --temperature 0
    phasechat compare --chat 3 --backend local --backend my-vllm --temperature 0

Where a side is a server (vLLM, llama-server), the KL is over each side's top 20 and
says so (a lower bound); a server's answer is its text split by its own tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from phasechat.chat.config.profiles import make_backend
from phasechat.chat.store.database import ChatNotFound, ChatStore, StoreError
from phasechat.chat.text import one_line
from phasechat.chat.trips.compare import (
    Side,
    aligned,
    fmt_cell,
    fmt_spread,
    metric_value,
    spread_of,
)
from phasechat.chat.trips.compare_targets import Target
from phasechat.chat.trips.diverge import Turn, chat_turns, diverge, overall, overall_floor
from phasechat.chat.trips.forced_sides import caveats, forced_of, reader_of
from phasechat.chat.trips.kv_cost import kv_bytes_per_token, kv_mib
from phasechat.chat.turns import InputError
from phasechat.cli.commands.options import fail
from phasechat.telemetry.divergence import Divergence
from phasechat.telemetry.records import dumps

#: each side's figures per turn: (key, title, unit)
PHASES = (
    ("ttft_ms", "TTFT", "ms"),
    ("prefill_tok_s", "prefill", "tok/s"),
    ("decode_tok_s", "decode", "tok/s"),
)


async def run_chat(
    chat_id: int, targets: tuple[Target, Target], as_json: bool, with_floor: bool = False
) -> int:
    """Compare the two targets over every turn of saved chat `chat_id` (`with_floor`:
    and A against itself read a token a step, the engine's floor)."""
    try:
        with ChatStore(readonly=True) as store:
            saved = store.open_chat(chat_id)
    except (ChatNotFound, StoreError) as exc:
        return fail(str(exc))
    for line in saved.unreadable:
        print(f"phasechat: warning: {line}", flush=True)
    turns = chat_turns(saved.conversation)
    if not turns:
        return fail(f"chat {chat_id} has no question to compare")
    ta, tb = targets
    a, b = make_backend(ta.spec), make_backend(tb.spec)
    before = os.getloadavg()
    try:
        for backend in (a, b):
            await backend.start()
            if backend.state == "failed":
                return fail(f"{backend.name}: {backend.state_detail}")
        if with_floor and forced_of(a) is None:
            return fail("--floor reads A a token a step: A must be the local model")
        sides = Side(ta.name, a, ta.settings), Side(tb.name, b, tb.settings)
        per_token = [kv_bytes_per_token(a), kv_bytes_per_token(b)]
        notes = caveats([reader_of(a), reader_of(b)])
        if not as_json:
            print(f"compare: chat {chat_id}, {len(turns)} turn(s), A then B each turn")
            for label, side in zip("AB", sides, strict=True):
                print(f"{label} = {one_line(side.name)} · {one_line(side.backend.model)}")
        try:
            told = None if as_json else _turn_line
            done = await diverge(*sides, turns, on_turn=told, with_floor=with_floor)
        except (InputError, ValueError) as exc:
            return fail(str(exc))
    finally:
        await a.aclose()
        await b.aclose()
    after = os.getloadavg()
    if as_json:
        print(dumps(_record(chat_id, sides, done, per_token, notes, before, after)))
    else:
        _summary(done, per_token, notes, before, after)
    return 0 if all(t.a.complete and t.b.complete for t in done) else 1


def _turn_line(t: Turn) -> None:
    parts = []
    for label, x in (("A", t.a), ("B", t.b)):
        m = x.metrics
        burst = " (a burst: no rate)" if m and m.decode_unknown else ""
        parts.append(
            f"{label} TTFT {fmt_cell(m.ttft_ms if m else None, 'ms')} ms, decode "
            f"{fmt_cell(m.decode_tok_s if m else None, '')} tok/s{burst}"
        )
    print(f"turn {t.number}: " + " | ".join(parts) + f" | {_divergence_text(t)}", flush=True)


def _divergence_text(t: Turn) -> str:
    d = t.divergence
    if d is None:
        return f"no divergence: {t.why}"
    first = "none" if d.first_divergence is None else f"token {d.first_divergence + 1}"
    said = (
        f"KL mean {d.kl_mean:.4f} max {d.kl_max:.4f} (token {d.kl_max_at + 1}), top-1 "
        f"{d.top1_agreement:.1%}, first divergence {first} of {d.positions}"
    )
    if t.taught is not None and t.taught.retokenized:
        said += " (A's answer re-tokenized from its text)"
    return said


def _kv_mib(turns: Sequence[Turn], side: int) -> float | None:
    """The KV cache a side held at the end of the chat's last turn, MiB."""
    for t in reversed(turns):
        if (mib := kv_mib((t.a, t.b)[side].metrics)) is not None:
            return mib
    return None


def drafted(turns: Sequence[Turn], side: int) -> tuple[int, int] | None:
    """A side's draft tokens accepted and proposed over every turn (None: no draft)."""
    accepted = proposed = 0
    for t in turns:
        m = (t.a, t.b)[side].metrics
        if m is not None and m.server_draft_n is not None:
            proposed += m.server_draft_n
            accepted += m.server_draft_accepted or 0
    return (accepted, proposed) if proposed else None


def same_answer(t: Turn) -> bool | None:
    """Whether B wrote A's answer token for token (None: either's tokens unknown). A
    draft, or any setting the teacher forcing cannot see, is judged by this: greedy
    verification keeps the model's own choices in exact arithmetic, but its batches sum
    in another order than one-token steps, and a near tie can flip."""
    a, b = t.a.trace.answer_tokens, t.b.trace.answer_tokens
    if a is None or b is None:
        return None
    return a.ids == b.ids


def _drafted_text(counts: tuple[int, int] | None) -> str:
    if counts is None:
        return "-"
    accepted, proposed = counts
    return f"{accepted:,}/{proposed:,} ({accepted / proposed:.0%})"


def _count(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _summary(
    turns: Sequence[Turn],
    per_token: Sequence[int | None],
    notes: Sequence[str],
    before: tuple[float, ...],
    after: tuple[float, ...],
) -> None:
    cells = [["", "A median [min-max]", "B median [min-max]"]]
    for key, title, unit in PHASES:
        a, b = (
            spread_of([metric_value(x.metrics, key) if x.metrics else None for x in side])
            for side in ([t.a for t in turns], [t.b for t in turns])
        )
        cells.append([f"{title} ({unit})", fmt_spread(a, unit), fmt_spread(b, unit)])
    kv = [_kv_mib(turns, 0), _kv_mib(turns, 1)]
    cells.append(["KV bytes/token", *(_count(n) for n in per_token)])
    cells.append(["KV cache (MiB)", *(fmt_cell(v, "MiB") for v in kv)])
    counts = [drafted(turns, 0), drafted(turns, 1)]
    if any(counts):
        cells.append(["draft accepted", *(_drafted_text(c) for c in counts)])
    print("\n" + "\n".join(aligned(cells, (16, 26, 26))))
    d = overall(turns)
    said = "nothing compared" if d is None else _overall_text(d, turns)
    print(f"B against A over A's answers: {said}")
    if d is not None and d.bound:
        for note in notes:  # what a server's figures cannot be
            print(f"  note: {note}")
    below = overall_floor(turns)
    if below is not None:
        print(f"A against itself, read a token a step (the engine's floor): {_figures(below)}")
    same = [same_answer(t) for t in turns]
    known = [x for x in same if x is not None]
    if known:
        print(f"B's own answers token for token A's: {sum(known)} of {len(known)} turns")
    print(f"load average (1, 5, 15 min): before {_load(before)}, after {_load(after)}")


def _figures(d: Divergence) -> str:
    return (
        f"{d.positions} tokens, KL mean {d.kl_mean:.4f}, p99 {d.kl_p99:.4f}, max "
        f"{d.kl_max:.4f}, top-1 agreement {d.top1_agreement:.1%}"
    )


def _overall_text(d: Divergence, turns: Sequence[Turn]) -> str:
    first = "none" if d.first_divergence is None else where(d.first_divergence, turns)
    return (
        f"{d.positions} tokens, KL mean {d.kl_mean:.4f}, p99 {d.kl_p99:.4f}, max {d.kl_max:.4f} "
        f"({where(d.kl_max_at, turns)}), top-1 agreement {d.top1_agreement:.1%}, first "
        f"divergence {first}"
    )


def where(position: int, turns: Sequence[Turn]) -> str:
    """A position of the divergence over the whole chat as its turn and answer token."""
    for t in turns:
        if t.divergence is None:
            continue
        if position < t.divergence.positions:
            return f"turn {t.number}, token {position + 1}"
        position -= t.divergence.positions
    raise ValueError(f"position {position} is past the turns' answers")


def _load(load: tuple[float, ...]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def _divergence_record(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "positions": d.positions,
        "kl_mean": d.kl_mean,
        "kl_p99": d.kl_p99,
        "kl_max": d.kl_max,
        "kl_max_at": d.kl_max_at,
        "top1_agreement": d.top1_agreement,
        "first_divergence": d.first_divergence,
        "top_k": d.top_k,
        "kl": list(d.kl),
    }


def _record(
    chat_id: int,
    sides: tuple[Side, Side],
    turns: Sequence[Turn],
    per_token: Sequence[int | None],
    notes: Sequence[str],
    before: tuple[float, ...],
    after: tuple[float, ...],
) -> dict[str, Any]:
    rows = []
    for t in turns:
        row: dict[str, Any] = {"turn": t.number}
        for label, x in (("a", t.a), ("b", t.b)):
            m = x.metrics
            row[label] = {
                "text": x.text,
                **{key: metric_value(m, key) if m else None for key, _, _ in PHASES},
                "output_tokens": m.output_tokens if m else None,
                "kv_bytes": m.kv_bytes if m else None,
                "kv_tokens": m.kv_used_tokens if m else None,
                "draft_n": m.server_draft_n if m else None,
                "draft_accepted": m.server_draft_accepted if m else None,
                "error": x.trace.error.message if x.trace.error else None,
            }
        row["divergence"] = _divergence_record(t.divergence)
        row["floor"] = _divergence_record(t.floor)
        row["why"] = t.why
        row["retokenized"] = t.taught.retokenized if t.taught is not None else None
        row["same_answer"] = same_answer(t)
        rows.append(row)
    d = overall(turns)
    return {
        "chat": chat_id,
        "sides": [{"name": s.name, "model": s.backend.model} for s in sides],
        "kv_mib": [_kv_mib(turns, 0), _kv_mib(turns, 1)],
        "kv_bytes_per_token": list(per_token),
        "turns": rows,
        "divergence": _divergence_record(d),
        "floor": _divergence_record(overall_floor(turns)),
        "caveats": list(notes),
        "loadavg_before": list(before),
        "loadavg_after": list(after),
    }
