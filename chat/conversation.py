"""The conversation: every message of a chat, as a tree, and the branch being shown.

A chat is a tree because tuning a prompt is editing it: an edited question, or a retried
answer, is a new *sibling* of the message it replaces, and the old one stays with its
answers and their metrics. The root is the system prompt (a `system` message, empty when
there is none); editing the system prompt makes a new root, whose branch starts with
copies of the messages kept. What a backend is sent is one path: from the root to the
current *leaf*.

Only `chat.turns.TurnController` changes a conversation; everything else reads it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from phasechat.backends.events import AnswerTokens, Message, Role
from phasechat.telemetry.anatomy import Anatomy
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
    #: an answer's prompt, by section (telemetry/anatomy.py), once it is known
    anatomy: Anatomy | None = None
    id: int = field(default_factory=lambda: next(_ids))
    #: the message before this one on its branch (None: a root, the system prompt)
    parent: int | None = None
    #: an answer's own token ids, where its engine said (the local model): sent back to
    #: that engine as they are (backends/local/prompts.py). Not saved: a chat read back from
    #: the database sends its answers as text.
    tokens: AnswerTokens | None = None

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

    def copy(self, parent: int | None) -> ChatMessage:
        """The same message under another parent (a branch that keeps it), with its own id."""
        return ChatMessage(
            self.role,
            self.content,
            self.backend,
            self.model,
            self.status,
            self.error,
            self.metrics,
            self.reasoning,
            self.anatomy,
            parent=parent,
            tokens=self.tokens,
        )

    def as_message(self) -> Message:
        """This message as a backend is sent it (an answer with its own token ids)."""
        return Message(self.role, self.content, self.tokens)


class Conversation:
    """The tree of a chat's messages, and the branch shown (root to `leaf`)."""

    def __init__(self, system: str = "", messages: Iterable[ChatMessage] = ()) -> None:
        """A chat whose root is `system`, with `messages` one after another under it."""
        self._nodes: dict[int, ChatMessage] = {}
        self._children: dict[int | None, list[int]] = {}
        #: the child each message last led to on the branch shown (a sibling switch
        #: higher up comes back to the branch that was shown below it)
        self._chosen: dict[int | None, int] = {}
        self.leaf: int | None = None
        self.add(ChatMessage("system", system))
        for message in messages:
            self.add(message)

    @classmethod
    def from_tree(cls, messages: Iterable[ChatMessage], leaf: int | None) -> Conversation:
        """A conversation of `messages` (parents before children), showing the branch
        that ends at `leaf` (None or unknown: the newest message's)."""
        conversation = cls.__new__(cls)
        conversation._nodes, conversation._children, conversation._chosen = {}, {}, {}
        conversation.leaf = None
        for message in messages:
            conversation._attach(message)
        if not conversation._nodes:
            conversation.add(ChatMessage("system", ""))
        conversation.select(leaf if leaf in conversation._nodes else max(conversation._nodes))
        return conversation

    # -- reading -----------------------------------------------------------------------
    def node(self, message_id: int) -> ChatMessage:
        """The message with this id (KeyError if none)."""
        return self._nodes[message_id]

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._nodes

    def path(self, leaf: int | None = None) -> list[ChatMessage]:
        """The branch from the root to `leaf` (default: the leaf shown), oldest first."""
        out: list[ChatMessage] = []
        at = self.leaf if leaf is None else leaf
        while at is not None:
            message = self._nodes[at]
            out.append(message)
            at = message.parent
        out.reverse()
        return out

    @property
    def root(self) -> ChatMessage:
        """The branch's root: its system prompt."""
        return self.path()[0]

    @property
    def system(self) -> str:
        """The system prompt of the branch shown ('' for none)."""
        root = self.root
        return root.content if root.role == "system" else ""

    @property
    def messages(self) -> list[ChatMessage]:
        """The branch shown, after its system prompt: what the chat shows, oldest first."""
        path = self.path()
        return path[1:] if path and path[0].role == "system" else path

    def questions(self) -> list[ChatMessage]:
        """The user messages of the branch shown (`--edit N` counts them from 1)."""
        return [m for m in self.messages if m.role == "user"]

    def every(self) -> Iterator[ChatMessage]:
        """Every message of every branch, in the order they were added."""
        return iter(self._nodes.values())

    def children(self, message_id: int | None) -> list[ChatMessage]:
        """The messages that follow `message_id` on some branch (None: the roots)."""
        return [self._nodes[i] for i in self._children.get(message_id, [])]

    def siblings(self, message: ChatMessage) -> list[ChatMessage]:
        """`message` and the other messages with its parent, oldest first."""
        return self.children(message.parent)

    def branch_of(self, message: ChatMessage) -> tuple[int, int]:
        """(`message`'s 1-based position among its siblings, how many there are)."""
        ids = self._children.get(message.parent, [])
        return ids.index(message.id) + 1, len(ids)

    def prompt_messages(self, leaf: int | None = None) -> tuple[Message, ...]:
        """What a backend gets for the branch ending at `leaf` (default: the one shown):
        its system prompt first, then every message sent as history (its answer text
        only: thinking is not sent back)."""
        path = self.path(leaf)
        system = path[0].content if path and path[0].role == "system" else ""
        rest = path[1:] if path and path[0].role == "system" else path
        out = [Message("system", system)] if system else []
        out.extend(m.as_message() for m in sendable(rest))
        return tuple(out)

    def sendable(self, skip: frozenset[int] = frozenset()) -> list[ChatMessage]:
        """The branch's messages sent as history (see `sendable`)."""
        return sendable(self.messages, skip)

    # -- changing (chat.turns.TurnController only) ---------------------------------------
    def add(self, message: ChatMessage) -> ChatMessage:
        """Add `message` after the leaf (a root when the chat is empty); it is the leaf now."""
        message.parent = self.leaf
        self._attach(message)
        self.select(message.id)
        return message

    def _attach(self, message: ChatMessage) -> None:
        if message.parent is not None and message.parent not in self._nodes:
            raise KeyError(f"message {message.id}'s parent {message.parent} is not in the chat")
        self._nodes[message.id] = message
        self._children.setdefault(message.parent, []).append(message.id)

    def rewind(self, message_id: int | None) -> None:
        """Make `message_id` the leaf, so the next `add` branches off after it (None:
        before the root: the next `add` is a new root)."""
        if message_id is not None and message_id not in self._nodes:
            raise KeyError(message_id)
        self.leaf = message_id

    def select(self, message_id: int) -> None:
        """Show the branch through `message_id`: down from it, the child chosen last
        time at each step (else the newest), to a leaf."""
        at = message_id
        while True:
            kids = self._children.get(at)
            if not kids:
                break
            chosen = self._chosen.get(at)
            at = chosen if chosen in kids else kids[-1]
        self.leaf = at
        for m in self.path(at):  # remember the way down, for a later switch above it
            self._chosen[m.parent] = m.id


def sendable(
    messages: Iterable[ChatMessage], skip: frozenset[int] = frozenset()
) -> list[ChatMessage]:
    """The messages sent as history, oldest first: those in prompt and not in `skip`
    (summarized), alternating strictly as every chat template and strict server wants.
    A user turn that got no answer in the prompt (the request failed, or was stopped
    before any text) stays in the chat but is not sent again, unless it is the newest
    message (the one being sent, or retried)."""
    kept = [m for m in messages if m.in_prompt and m.id not in skip]
    out: list[ChatMessage] = []
    for i, m in enumerate(kept):
        after = kept[i + 1] if i + 1 < len(kept) else None
        if m.role == "user" and after is not None and after.role != "assistant":
            continue  # unanswered: its question is not asked twice in a row
        if m.role == "assistant" and (not out or out[-1].role != "user"):
            continue  # an answer whose question is not sent
        out.append(m)
    return out
