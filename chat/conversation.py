"""The conversation: what was said, by whom, and which backend and model answered."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

from phasechat.backends.events import Message, Role
from phasechat.telemetry.metrics import Metrics

Status = Literal["complete", "streaming", "cancelled", "error"]
_ids = itertools.count(1)


@dataclass
class ChatMessage:
    """One message of the chat, with where it came from and how it ended."""

    role: Role
    content: str
    backend: str | None = None
    model: str | None = None
    status: Status = "complete"
    error: str | None = None
    metrics: Metrics | None = None
    #: a thinking model's chain of thought: saved and shown, never sent back as history
    #: (the models' own chat templates drop it from earlier turns too)
    reasoning: str = ""
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def in_prompt(self) -> bool:
        """Whether this message is sent back to the model as history.

        A cancelled answer keeps its partial text (the user saw it); a failed answer
        with no text is shown but not sent, and so is a user turn the model refused to
        read (larger than the context), so the chat can go on.
        """
        if self.role == "user":
            return self.status != "error"  # e.g. a prompt that did not fit the context
        return bool(self.content)


@dataclass
class Conversation:
    """The system prompt plus the messages, oldest first."""

    system: str = ""
    messages: list[ChatMessage] = field(default_factory=list)

    def prompt_messages(self) -> tuple[Message, ...]:
        """What a backend gets: the system prompt first, then every message sent as
        history (its answer text only: thinking is not sent back)."""
        out = [Message("system", self.system)] if self.system else []
        out.extend(Message(m.role, m.content) for m in self.sendable())
        return tuple(out)

    def sendable(self, skip: frozenset[int] = frozenset()) -> list[ChatMessage]:
        """The messages sent as history, oldest first: those in prompt and not in `skip`
        (summarized), alternating strictly as every chat template and strict server
        wants. A user turn that got no answer in the prompt (the request failed, or was
        stopped before any text) stays in the chat but is not sent again, unless it is
        the newest message (the one being sent, or retried)."""
        kept = [m for m in self.messages if m.in_prompt and m.id not in skip]
        out: list[ChatMessage] = []
        for i, m in enumerate(kept):
            after = kept[i + 1] if i + 1 < len(kept) else None
            if m.role == "user" and after is not None and after.role != "assistant":
                continue  # unanswered: its question is not asked twice in a row
            if m.role == "assistant" and (not out or out[-1].role != "user"):
                continue  # an answer whose question is not sent
            out.append(m)
        return out

    def add(self, message: ChatMessage) -> ChatMessage:
        self.messages.append(message)
        return message
