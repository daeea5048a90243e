"""A think block over a token stream: `<think>...</think>` is reasoning, the rest answer.

Split as llama-server splits it with its default reasoning format (deepseek): the block
is opened either by the chat template (the prompt ends with `<think>`, as Qwen3's,
DeepSeek-R1's and SmolLM3's templates do in thinking mode: llama-server's
"thinking forced open") or by the model's own first words; it ends at `</think>`.
Whitespace that starts the thinking, or the answer after it, is dropped (a model that
does not think keeps its text exactly). A tag split across tokens
is held back until the next piece decides it, as `StopMatcher` holds a stop string.
"""

from __future__ import annotations

from phasechat.backends.events import ReasoningDelta, TextDelta

OPEN, CLOSE = "<think>", "</think>"

#: (is_reasoning, text)
Piece = tuple[bool, str]


def opens_think(prompt: str) -> bool:
    """Whether a templated prompt leaves a think block open for the model to continue."""
    return prompt.rstrip().endswith(OPEN)


class ThinkSplitter:
    """Feed decoded text; get the pieces that are safe to show, each marked reasoning or
    answer. `opened`: the prompt already opened the block."""

    def __init__(self, opened: bool = False) -> None:
        self.thinking = opened
        self._start = True  # nothing shown yet: "<think>" may open, whitespace is dropped
        self._held = ""
        self._closed = False  # the block ended: the answer's leading whitespace goes

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (possibly none: a partial tag is held)."""
        buf, self._held = self._held + text, ""
        out: list[Piece] = []
        while buf:
            if self._start:
                stripped = buf.lstrip()
                if not self.thinking and stripped.startswith(OPEN):
                    self.thinking = True
                    buf = stripped[len(OPEN) :]
                    continue
                if not stripped or (not self.thinking and OPEN.startswith(stripped)):
                    self._held = buf  # whitespace, or the start of "<think>": undecided
                    break
                self._start = False
                if self.thinking or self._closed:  # a plain answer keeps its whitespace
                    buf = stripped
            if not self.thinking:
                out.append((False, buf))
                break
            cut = buf.find(CLOSE)
            if cut >= 0:
                out.append((True, buf[:cut]))
                self.thinking, self._start, self._closed = False, True, True
                buf = buf[cut + len(CLOSE) :]
                continue
            keep = _partial_suffix(buf, CLOSE)
            out.append((True, buf[: len(buf) - keep]))
            self._held = buf[len(buf) - keep :]
            break
        return [(kind, piece) for kind, piece in out if piece]

    def token_events(self, text: str, t_ns: int | None = None) -> list[ReasoningDelta | TextDelta]:
        """One token's events: exactly one token counted, with the first piece (a token
        that closes the block may carry the thinking's end and the answer's start), or
        on an empty event of the kind it belongs to when its text is held back."""
        was_thinking = self.thinking
        pieces = self.feed(text)
        if not pieces:
            thinking = was_thinking or self.thinking  # a tag's tokens belong to the thinking
            return [ReasoningDelta("", 1, t_ns) if thinking else TextDelta("", 1, t_ns)]
        return _events(pieces, 1, t_ns)

    def tail_events(self, text: str) -> list[ReasoningDelta | TextDelta]:
        """The end of the stream: `text` (no token of its own) and whatever was held."""
        return _events([*self.feed(text), *self.flush()], 0)

    def flush(self) -> list[Piece]:
        """End of stream: what was held is text of the current kind after all."""
        held, self._held = self._held, ""
        if self._start and (self.thinking or self._closed):
            held = held.strip()
        return [(self.thinking, held)] if held else []


def _events(
    pieces: list[Piece], tokens: int, t_ns: int | None = None
) -> list[ReasoningDelta | TextDelta]:
    """Events for `pieces`; the token (and the time it was made) goes with the first."""
    out: list[ReasoningDelta | TextDelta] = []
    for thinking, text in pieces:
        kind = ReasoningDelta if thinking else TextDelta
        out.append(kind(text, tokens, t_ns))
        tokens = 0
    return out


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of `tag`."""
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0
