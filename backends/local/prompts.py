"""A local model's prompts: messages -> chat template -> token ids, kept for the next ask.

The local backend asks for the same prompt several times in a row (a forecast wants its
token count and its cached prefix; a send formats it again), so the last result is kept.
Two threads ask (the UI for forecasts, the llama thread for sends): the cache is one
tuple, read and replaced whole.

Token-exact history: an earlier answer this engine wrote (`Message.tokens`) goes back as
the very ids it sampled, not as its text tokenized again. A sampled answer is often a
split the tokenizer would not choose ("K" + "VC" where it writes "KV" + "C"); tokenized
again it differs from what the KV cache holds, and the engine reads the rest of the
answer again, every turn. So the template is rendered with a placeholder in place of
each such answer, the text between placeholders is tokenized, and the answers' ids go
in between. It is used only when it reads as the same text (docs/editing.md): the
answer's ids spell its text exactly, the template keeps the text as it is (one that
trims or rewrites an answer does not), and the spliced prompt's bytes are the plain
prompt's; otherwise the plain tokenization is used.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from phasechat.backends.base import PromptRefused
from phasechat.backends.events import AnswerTokens, Message
from phasechat.backends.local.llama_glue import NO_SYSTEM_ROLE, fold_system
from phasechat.backends.local.think import opens_think

Key = tuple[tuple[Message, ...], tuple[AnswerTokens | None, ...]]
Formatted = tuple[Key, list[int], list[str], bool, str]


class Prompts:
    """Formats prompts with a model's chat template and tokenizer."""

    def __init__(
        self, llm: Any, formatter: Callable[..., Any], format_name: str, vocab: str = ""
    ) -> None:
        """`vocab`: the engine's identity (`AnswerTokens.vocab`): an answer's ids are
        spliced in only when they were made by it."""
        self.llm, self.formatter, self.format_name = llm, formatter, format_name
        self.vocab = vocab
        self._last: Formatted | None = None

    def tokens(self, messages: Sequence[Message]) -> tuple[list[int], list[str]]:
        """Token ids of the chat-templated prompt, and the template's stop strings.
        Raises `PromptRefused` when the template refuses the messages."""
        last = self._formatted(messages)
        return list(last[1]), list(last[2])

    def rendered(self, messages: Sequence[Message]) -> tuple[str, list[int]]:
        """The chat-templated text of the prompt and its token ids."""
        last = self._formatted(messages)
        return last[4], list(last[1])

    def opens_think(self, messages: Sequence[Message]) -> bool:
        """Whether the templated prompt ends inside an open `<think>` block."""
        return self._formatted(messages)[3]

    def _formatted(self, messages: Sequence[Message]) -> Formatted:
        # the ids are not part of a message's equality: the key holds them too
        key = (tuple(messages), tuple(m.tokens for m in messages))
        last = self._last  # read once: two threads call this
        if last is None or last[0] != key:
            last = (key, *self._format(messages))
            self._last = last
        return last

    def _format(self, messages: Sequence[Message]) -> tuple[list[int], list[str], bool, str]:
        msgs = _dicts(messages, self.format_name)
        result = self._render(msgs)
        stop = result.stop
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        add_bos = not result.added_special
        tokens = self._tokenize(result.prompt, add_bos)
        spliced = self._spliced(messages, result.prompt, add_bos, tokens)
        if spliced is not None:
            tokens = spliced
        return tokens, [s for s in stops if s], opens_think(result.prompt), result.prompt

    def _render(self, msgs: list[dict[str, str]]) -> Any:
        try:
            return self.formatter(messages=msgs)
        except Exception as exc:  # a Jinja template that raises on these messages
            lines = str(exc).strip().splitlines()
            why = lines[0] if lines else type(exc).__name__
            raise PromptRefused(
                f"the model's chat template refused this conversation: {why}"
            ) from None

    def _tokenize(self, text: str, add_bos: bool) -> list[int]:
        if not text:
            return []
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def _spliced(
        self, messages: Sequence[Message], plain: str, add_bos: bool, tokens: list[int]
    ) -> list[int] | None:
        """The prompt with each answer this engine wrote as its own ids (None: none to
        splice, or the result would not read as `plain`, the template's own text)."""
        ids = [self._answer_ids(m) if m.role == "assistant" else None for m in messages]
        if not any(ids):
            return None
        nonce = secrets.token_hex(8)
        marks = [f"\x00splice-{nonce}-{i}\x00" if x else "" for i, x in enumerate(ids)]
        marked = [
            Message(m.role, mark or m.content) for m, mark in zip(messages, marks, strict=True)
        ]
        try:
            text = self._render(_dicts(marked, self.format_name)).prompt
        except PromptRefused:
            return None
        out: list[int] = []
        at, first, restored = 0, True, []
        for m, mark, answer in zip(messages, marks, ids, strict=True):
            if answer is None:
                continue
            cut = text.find(mark, at)
            if cut < 0 or text.count(mark) != 1:  # the template moved or copied it
                return None
            out += self._tokenize(text[at:cut], add_bos and first)
            out += answer
            restored += [text[at:cut], m.content]
            at, first = cut + len(mark), False
        out += self._tokenize(text[at:], False)
        restored.append(text[at:])
        # the template kept each answer's text as it is (one that trims it does not)...
        if "".join(restored) != plain:
            return None
        # ... and the whole reads as the plain prompt, byte for byte (an SPM tokenizer's
        # space after a control token, say, would not)
        if self._bytes(out) != self._bytes(tokens):
            return None
        return out

    def _answer_ids(self, message: Message) -> list[int] | None:
        """The ids of `message`'s text among the tokens it was written as (None: not
        this engine's, or they do not spell it: an edited answer, a stop string cut
        inside a token)."""
        t = message.tokens
        if t is None or not self.vocab or t.vocab != self.vocab or not message.content:
            return None
        return answer_span(t, message.content.encode("utf-8"))

    def _bytes(self, tokens: list[int]) -> bytes:
        return bytes(self.llm.detokenize(tokens, special=True))


def answer_span(tokens: AnswerTokens, text: bytes) -> list[int] | None:
    """The ids of a run of `tokens` whose bytes are exactly `text`, starting and ending
    on token boundaries (None: there is none). The answer's text is usually all of its
    tokens; a thinking model's answer comes after its thinking (not sent back), and a
    stop string's tokens follow the text."""
    if len(tokens.ids) != len(tokens.pieces):
        return None
    starts, at = {}, 0
    for i, piece in enumerate(tokens.pieces):
        starts[at] = i
        at += len(piece)
    starts[at] = len(tokens.pieces)
    joined = b"".join(tokens.pieces)
    found = joined.find(text)
    while found >= 0:
        begin, end = starts.get(found), starts.get(found + len(text))
        if begin is not None and end is not None:
            return list(tokens.ids[begin:end])
        found = joined.find(text, found + 1)
    return None


def _dicts(messages: Sequence[Message], format_name: str) -> list[dict[str, str]]:
    msgs = [{"role": m.role, "content": m.content} for m in messages]
    return fold_system(msgs) if format_name in NO_SYSTEM_ROLE else msgs
