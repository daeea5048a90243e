"""A local model's prompts: messages -> chat template -> token ids, kept for the next ask.

The local backend asks for the same prompt several times in a row (a forecast wants its
token count and its cached prefix; a send formats it again), so the last result is kept.
Two threads ask (the UI for forecasts, the llama thread for sends): the cache is one
tuple, read and replaced whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from phasechat.backends.base import PromptRefused
from phasechat.backends.events import Message
from phasechat.backends.llama_glue import NO_SYSTEM_ROLE, fold_system
from phasechat.backends.think import opens_think

Formatted = tuple[tuple[Message, ...], list[int], list[str], bool, str]


class Prompts:
    """Formats prompts with a model's chat template and tokenizer."""

    def __init__(self, llm: Any, formatter: Callable[..., Any], format_name: str) -> None:
        self.llm, self.formatter, self.format_name = llm, formatter, format_name
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
        key, last = tuple(messages), self._last  # read once: two threads call this
        if last is None or last[0] != key:
            last = (key, *self._format(messages))
            self._last = last
        return last

    def _format(self, messages: Sequence[Message]) -> tuple[list[int], list[str], bool, str]:
        msgs = [{"role": m.role, "content": m.content} for m in messages]
        if self.format_name in NO_SYSTEM_ROLE:
            msgs = fold_system(msgs)
        try:
            result = self.formatter(messages=msgs)
        except Exception as exc:  # a Jinja template that raises on these messages
            lines = str(exc).strip().splitlines()
            why = lines[0] if lines else type(exc).__name__
            raise PromptRefused(
                f"the model's chat template refused this conversation: {why}"
            ) from None
        stop = result.stop
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        tokens = self.llm.tokenize(
            result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True
        )
        return list(tokens), [s for s in stops if s], opens_think(result.prompt), result.prompt
