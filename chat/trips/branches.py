"""Two sibling branches of a message, compared: the answers an edit or a retry made,
with the figures recorded when they were answered, and the prompt each was given, so
the comparison can run each of them again (cold, `Comparison.run`) as `compare` does.

Siblings of an answer (a retry) share their prompt; siblings of a question (an edit)
each have their own. A side trip like every comparison: the chat is not touched.
"""

from __future__ import annotations

from phasechat.backends.events import Message
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trips.compare import Answer, Comparison, Side, request_for
from phasechat.chat.turns import InputError, TurnController
from phasechat.telemetry.recorder import Trace


def answer_of(conversation: Conversation, message: ChatMessage) -> ChatMessage | None:
    """An answer itself, or a question's newest answer."""
    if message.role == "assistant":
        return message
    answers = [m for m in conversation.children(message.id) if m.role == "assistant"]
    return answers[-1] if answers else None


def prompt_of(turns: TurnController, answer: ChatMessage) -> tuple[Message, ...]:
    """The messages `answer` was given: its request, where this session sent it, else
    its branch as the chat sends history (the system prompt, then what is sent)."""
    for exchange in turns.exchanges:
        if exchange.answer.id == answer.id and exchange.request is not None:
            return exchange.request.messages
    return turns.conversation.prompt_messages(answer.parent)


def branch_comparison(turns: TurnController, message: ChatMessage) -> Comparison:
    """`message` (a question or an answer with siblings) against its next sibling (the
    one before, for the last), with their recorded answers. Raises InputError when
    there is no sibling, or a side has no finished answer to show."""
    conversation = turns.conversation
    siblings = conversation.siblings(message)
    if message.role == "system" or len(siblings) < 2:
        raise InputError("no other branch here: edit the question or retry the answer first")
    at = [m.id for m in siblings].index(message.id)
    other = siblings[at + 1] if at + 1 < len(siblings) else siblings[at - 1]
    pair = sorted((message, other), key=lambda m: [s.id for s in siblings].index(m.id))
    sides, recorded = [], []
    for m in pair:
        answer = answer_of(conversation, m)
        if answer is None or answer.metrics is None:
            raise InputError("a branch here has no finished answer to compare")
        messages = prompt_of(turns, answer)
        index, count = conversation.branch_of(m)
        sides.append(Side(f"‹{index}/{count}›", turns.backend, turns.settings, messages))
        recorded.append((answer, messages))
    comparison = Comparison(sides[0], sides[1], sides[0].messages or (), together=False, cold=True)
    for side, (answer, messages) in enumerate(recorded):
        trace = Trace(answer.backend or "", answer.model or "", text_parts=[answer.content])
        request = request_for(turns.settings, messages)
        comparison.answers.append(Answer(side, 0, trace, request, answer.metrics, started=True))
    return comparison
