"""A saved chat, every turn, on two engine settings of one local model: what each side
costs (its answer's phases) and how far B's next-token distributions move from A's over
A's answer (telemetry/divergence.py), teacher-forced.

Each turn is the chat's branch up to one of its questions, the earlier answers as the
chat saved them (both sides read the same history), sent to A then B as a compare round
(chat/trips/compare.py). A's answer tokens are then read by both settings in one
evaluation each (backends/teacher.py), so the divergence has no sampling in it: at
temperature 0 two identical settings give KL 0 and agreement 1 over the whole chat.

The sides may load two model files (`model=PATH`): another quantization of the same
model shares its vocabulary, and its divergence is measured the same way. A model with
another vocabulary reads A's token ids as other text: teacher forcing would compare
nonsense, so the turns say so and carry the speed figures alone. A draft model
(`draft=`) changes neither the model nor its numbers: its divergence is 0 by design.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.backends.gguf import vocabulary
from phasechat.backends.local import LocalBackend, LocalConfig
from phasechat.backends.teacher import EngineSetting, forced_logits
from phasechat.chat.conversation import Conversation
from phasechat.chat.trips.compare import Answer, Comparison, Side
from phasechat.telemetry.divergence import Divergence, combine, compare_logits


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the comparison: its number (1 = the chat's first question), both
    sides' answers, and the divergence over A's answer (None: `why`)."""

    number: int
    a: Answer
    b: Answer
    divergence: Divergence | None
    why: str | None = None


def chat_turns(conversation: Conversation) -> list[tuple[Message, ...]]:
    """Each question of the branch shown, with the system prompt and the messages before
    it as the chat saved them (answers that were cut off or failed are left out, as a
    turn leaves them out of its history)."""
    system = conversation.system
    head = (Message("system", system),) if system else ()
    out: list[tuple[Message, ...]] = []
    history: list[Message] = []
    for m in conversation.messages:
        if m.role == "user":
            out.append((*head, *history, Message("user", m.content)))
        if m.in_prompt:
            history.append(Message(m.role, m.content))
    return out


def vocabulary_differs(a: Path, b: Path) -> str | None:
    """Why A's token ids mean nothing to model `b` (None: the same vocabulary)."""
    if a == b:
        return None
    va, vb = vocabulary(a), vocabulary(b)
    if va and va == vb:
        return None
    return (
        f"the models' vocabularies differ ({a.name}: {va or 'none named'}; {b.name}: "
        f"{vb or 'none named'}): B would read A's tokens as other text, so no divergence "
        "is measured; the speed figures stand"
    )


@dataclass(frozen=True, slots=True)
class Forced:
    """What teacher forcing reads one side with: its model file and engine setting."""

    model: Path
    setting: EngineSetting


def forced_of(backend: Backend) -> Forced | None:
    """A local side's model file, its KV type, the flash attention it loaded with and
    its threads (a `LocalBackend`, or the same in a child process); None: a remote
    side, or a model not found."""
    path = getattr(backend, "model_path", None)
    config = getattr(backend, "config", None)
    if not isinstance(path, Path) or not isinstance(config, LocalConfig):
        return None
    flash = getattr(backend, "flash_attn", None)
    threads = getattr(backend, "threads", 0)
    return Forced(path, EngineSetting(config.kv_type, flash, threads or None))


async def prompt_ids(backend: Backend, messages: tuple[Message, ...]) -> list[int] | None:
    """The prompt's token ids as a local side's model reads them (None: a remote side,
    a model not loaded, a template that refuses the messages)."""
    read = getattr(backend, "prompt_ids", None)
    if read is None:
        return None
    ids: list[int] | None = await read(messages)
    return ids


def answer_divergence(
    a: Forced,
    b: Forced,
    prompt: Sequence[int],
    answer: Sequence[int],
    progress: Callable[[str, int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> Divergence:
    """B's divergence from A over `answer` (A's answer token ids after `prompt`), each
    side reading the whole sequence once; blocking (run it in a thread).
    `progress(side, read, total)` as each side reads ("A", then "B"); a set `stop` raises
    `teacher.Stopped`. The caller has checked the vocabularies (`vocabulary_differs`)."""
    sequence, start = [*prompt, *answer], len(prompt)
    logits = []
    for label, side in (("A", a), ("B", b)):
        told = None if progress is None else partial(progress, label)
        logits.append(forced_logits(side.model, side.setting, sequence, start, told, stop))
    return compare_logits(*logits)


async def diverge(
    a: Side,
    b: Side,
    turns: Sequence[tuple[Message, ...]],
    on_turn: Callable[[Turn], None] | None = None,
) -> list[Turn]:
    """Every turn on A then B, and B's divergence from A over A's answer. Both sides must
    be local backends; on two model files of different vocabularies each turn says why
    it has no divergence (`vocabulary_differs`)."""
    la, lb = a.backend, b.backend
    if not isinstance(la, LocalBackend) or not isinstance(lb, LocalBackend):
        raise ValueError("a divergence needs two local sides (their logits)")
    ma, mb = la.model_path, lb.model_path
    if ma is None or mb is None:
        raise ValueError("a divergence needs each side's model file")
    differs = vocabulary_differs(ma, mb)
    out: list[Turn] = []
    for n, messages in enumerate(turns):
        comparison = Comparison(a, b, messages, together=False)
        ra, rb = await comparison.run_round(n)
        if differs is not None:
            turn = Turn(n + 1, ra, rb, None, differs)
        else:
            turn = await _turn(n + 1, ra, rb, la, lb, messages)
        out.append(turn)
        if on_turn is not None:
            on_turn(turn)
    return out


async def _turn(
    number: int,
    ra: Answer,
    rb: Answer,
    la: LocalBackend,
    lb: LocalBackend,
    messages: tuple[Message, ...],
) -> Turn:
    ids = ra.trace.answer_tokens
    if not ra.complete or ids is None or not ids.ids:
        return Turn(number, ra, rb, None, "A gave no complete answer")
    prompt, _ = la.format_prompt(messages)
    fa, fb = forced_of(la), forced_of(lb)
    assert fa is not None and fb is not None  # local sides, their models found
    # each answer token's distribution, the first from the prompt's last position
    divergence = await asyncio.to_thread(answer_divergence, fa, fb, prompt, ids.ids)
    return Turn(number, ra, rb, divergence)


def overall(turns: Sequence[Turn]) -> Divergence | None:
    """The divergence over every compared position of every turn, in order."""
    parts = [t.divergence for t in turns if t.divergence is not None]
    return combine(parts) if parts else None
