"""A saved chat, every turn, on two sides (two engine settings of one local model, or
the model here against a server, or two servers): what each side costs (its answer's
phases) and how far B's next-token distributions move from A's over A's answer
(telemetry/divergence.py), teacher-forced.

Each turn is the chat's branch up to one of its questions, the earlier answers as the
chat saved them (both sides read the same history), sent to A then B as a compare round
(chat/trips/compare.py). A's answer tokens are then read by both sides
(chat/trips/forced_sides.py: the model here in one evaluation, a server through its
log-probabilities), so the divergence has no sampling in it: at temperature 0 two
identical settings give KL 0 and agreement 1 over the whole chat.

The sides may load two model files (`model=PATH`): another quantization of the same
model shares its vocabulary, and its divergence is measured the same way. A model with
another vocabulary reads A's token ids as other text: teacher forcing would compare
nonsense, so the turns say so and carry the speed figures alone. A draft model
(`draft=`) changes neither the model nor its numbers: its divergence is 0 by design.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from phasechat.backends.events import Message
from phasechat.chat.conversation import Conversation
from phasechat.chat.trips.compare import Answer, Comparison, Side
from phasechat.chat.trips.forced_sides import (
    Reader,
    Teaching,
    floor,
    measure,
    reader_of,
    teaching,
    vocabulary_check,
    why_unread,
)
from phasechat.telemetry.divergence import Divergence, combine


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the comparison: its number (1 = the chat's first question), both
    sides' answers, and the divergence over A's answer (None: `why`)."""

    number: int
    a: Answer
    b: Answer
    divergence: Divergence | None
    why: str | None = None
    #: the sequence both sides read (None: none was made)
    taught: Teaching | None = None
    #: A against itself read a token a step: the engine's floor (None: not asked, or
    #: A is a server)
    floor: Divergence | None = None


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


async def diverge(
    a: Side,
    b: Side,
    turns: Sequence[tuple[Message, ...]],
    on_turn: Callable[[Turn], None] | None = None,
    with_floor: bool = False,
) -> list[Turn]:
    """Every turn on A then B, and B's divergence from A over A's answer; a side that
    cannot be read teacher-forced (a server that gives no log-probabilities), or
    another vocabulary, leaves each turn's divergence out and says why. Sides are
    started: their readers are asked once, before the first turn. `with_floor`: each
    turn also measures the engine's floor where A is the model here (`floor`)."""
    ha, hb = reader_of(a.backend), reader_of(b.backend)
    if ha is None or hb is None:
        side, label = (a, "A") if ha is None else (b, "B")
        why: str | None = f"{label}: {why_unread(side.backend)}"
    else:  # two model files of other vocabularies: said once, each turn carries it
        why = await vocabulary_check(ha, hb, None)
    out: list[Turn] = []
    for n, messages in enumerate(turns):
        comparison = Comparison(a, b, messages, together=False)
        ra, rb = await comparison.run_round(n)
        if why is not None or ha is None or hb is None:
            turn = Turn(n + 1, ra, rb, None, why)
        else:
            turn = await _turn(n + 1, ra, rb, (ha, hb), a, messages)
            if with_floor and turn.taught is not None:
                below = await asyncio.to_thread(floor, ha, turn.taught)
                turn = replace(turn, floor=below)
        out.append(turn)
        if on_turn is not None:
            on_turn(turn)
    return out


async def _turn(
    number: int,
    ra: Answer,
    rb: Answer,
    readers: tuple[Reader, Reader],
    a: Side,
    messages: tuple[Message, ...],
) -> Turn:
    if not ra.complete:
        return Turn(number, ra, rb, None, "A gave no complete answer")
    try:
        t = await teaching(readers[0], a.backend, messages, ra.text, ra.trace.answer_tokens)
    except ValueError as exc:  # TeacherError included: the server's reason
        return Turn(number, ra, rb, None, str(exc))
    divergence, why = await measure(*readers, t)
    return Turn(number, ra, rb, divergence, why, t)


def overall(turns: Sequence[Turn]) -> Divergence | None:
    """The divergence over every compared position of every turn, in order."""
    parts = [t.divergence for t in turns if t.divergence is not None]
    return combine(parts) if parts else None


def overall_floor(turns: Sequence[Turn]) -> Divergence | None:
    """The engine's floor over every turn that measured one, in order."""
    parts = [t.floor for t in turns if t.floor is not None]
    return combine(parts) if parts else None
