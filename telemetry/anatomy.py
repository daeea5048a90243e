"""Prompt anatomy: which part of a prompt the prefill paid for, and where the cache broke.

A request's prompt, as the engine read it, is split into sections: the chat template's
own tokens, the system prompt, the trimmer's summary, each earlier message, and the new
message. Each section gets its tokens, how many of them the engine had cached, how many
it read, and the prefill time apportioned to it (evaluated tokens x the prefill's ms per
evaluated token: attention makes late tokens a little dearer than early ones, so this is
a fair share, not a measurement of each section).

Exact where the engine's own tokenizer is at hand (`RenderedPrompt`: the templated text
and each token's bytes; the local model, llama-server): every token is given to the
section its first byte lies in, so the sections add up to the prompt's tokens exactly.
Elsewhere each section is estimated (`source` "estimate"), and the template gets what is
left of the prompt's count.

A cache break: the engine held the previous request (its prompt and its answer) and
this one reused less of it than it could. Where the tokens are known (the local model's,
llama-server's /tokenize) the two are compared token by token: a break whose text is the
same on both sides is a re-tokenization (a sampled answer that the tokenizer, reading its
text again, splits otherwise), named as such; one whose text differs is an edit, and
where the two texts first differ says which message changed and what changed there.

An engine that caches in whole blocks (vLLM's KV blocks: a server family's
`cache_grain`, or the block size its /metrics states) reuses at most the held tokens'
whole blocks (`reusable`): the tokens of the last, partial block are read again on
every turn, and are no break. Where neither side's tokens are known (an estimate), a
held text that is the start of this prompt's says only that some of it was read again:
the cause cannot be named without the server's tokens.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

SectionKind = Literal["template", "system", "summary", "history", "new"]
#: "edit": the text changed; "retokenized": the same text, other tokens; "other": the
#: engine held something else since (a summary, a side trip on the same engine), its
#: tokens agreeing; "unexplained": the held text is the start of this prompt's, but no
#: tokens are known to say why the engine read some of it again
BreakKind = Literal["edit", "retokenized", "other", "unexplained"]

#: A break of fewer tokens than this is the template re-reading the end of the last
#: answer (its end-of-turn marker, a trailing space), not a change.
BREAK_MIN_TOKENS = 4
#: Characters of each text shown around a break.
AROUND = 24


def reusable(held_tokens: int, grain: int) -> int:
    """How many of `held_tokens` (a prompt and its answer) an engine that caches whole
    blocks of `grain` tokens can reuse: the whole blocks of all but the last token (the
    answer's last sampled token is never read back, so its KV is never written; vLLM).
    Grain 1 (any prefix, llama.cpp) keeps them all: its re-read end is BREAK_MIN_TOKENS'."""
    if grain <= 1:
        return held_tokens
    return max(0, held_tokens - 1) // grain * grain


@dataclass(frozen=True, slots=True)
class Part:
    """A piece of the prompt's text that is the user's (not the template's): the system
    prompt, the summary, or one message's content. `message_index`: its message's place
    in the request (0 = the system message when there is one)."""

    kind: SectionKind
    message_index: int
    text: str


@dataclass(frozen=True, slots=True)
class Section:
    """One section of a prompt and what its prefill cost."""

    kind: SectionKind
    message_index: int | None  # None: the template's own tokens
    tokens: int
    cached_tokens: int | None  # None: the engine does not say what it had cached
    evaluated_tokens: int | None
    prefill_ms: float | None


@dataclass(frozen=True, slots=True)
class CacheBreak:
    """Where the prompt first differs from what the engine held, and what it cost."""

    message_index: int | None  # None: before the first message (or the engine held another prompt)
    char_offset: int  # in that message's text
    held: str  # the text the engine had there
    sent: str  # ... and the text sent instead
    tokens_read_again: int | None
    estimated: bool
    kind: BreakKind = "edit"
    #: a "retokenized" break lies in the answer the engine wrote last (after its prompt)
    in_answer: bool = False
    #: the engine reuses whole blocks of this many tokens (1: any prefix); the tokens
    #: read again are counted beyond the held tokens' last partial block
    grain: int = 1

    def line(self) -> str:
        """One line for a person: "cache broke in message 3 at character 118: ...", or
        "the previous answer was tokenized differently at ‹K|VC›, 77 tokens read again"."""
        if self.kind == "retokenized":
            return self._retokenized_line()
        if self.kind == "other":
            again = (
                f"; {self.tokens_read_again:,} tokens read again" if self.tokens_read_again else ""
            )
            return f"cache broke: the engine held something else since{again}{self._blocks()}"
        if self.kind == "unexplained":
            n = f"{self.tokens_read_again:,} tokens" if self.tokens_read_again else "some"
            return (
                f"cache: {n} of what the engine held read again{self._blocks()}; "
                "the cause is not known without the server's tokens"
            )
        where = (
            f"in message {self.message_index} at character {self.char_offset}"
            if self.message_index is not None
            else "before the first message"
        )
        again = (
            f"; {self.tokens_read_again:,} tokens read again"
            if self.tokens_read_again is not None
            else ""
        )
        approx = " (estimated)" if self.estimated else ""
        return f"cache broke {where}: `{self.held}` -> `{self.sent}`{again}{self._blocks()}{approx}"

    def _blocks(self) -> str:
        """Where the engine caches whole blocks: so the count is beyond its last one."""
        return f" (beyond whole blocks of {self.grain:,})" if self.grain > 1 else ""

    def _retokenized_line(self) -> str:
        if self.in_answer:
            what = "the previous answer"
        elif self.message_index is not None:
            what = f"message {self.message_index}"
        else:
            what = "the prompt"
        # `held`: the engine's split ("K|VC"), where known; `sent`: this prompt's. A
        # server's answer tokens are not seen: the same text read again is most likely
        # split otherwise, but that cannot be confirmed
        at = (
            f"‹{self.held}› (now ‹{self.sent}›)"
            if self.held
            else f"‹{self.sent}› (as sent now; its own tokens not seen: not confirmed)"
        )
        again = (
            f", {self.tokens_read_again:,} tokens read again"
            if self.tokens_read_again is not None
            else ""
        )
        return f"{what} was tokenized differently at {at}{again}{self._blocks()}"


@dataclass(frozen=True, slots=True)
class Anatomy:
    """A request's prompt, split by section, with where its cached prefix ended."""

    sections: tuple[Section, ...]
    #: "tokenizer" (the local model's own), "server" (llama-server's /tokenize), "estimate"
    source: str
    cache_break: CacheBreak | None = None
    #: the exact text the engine read ('' when it is not known), each section's spans in
    #: it (start, end, index into `sections`), and where the cached prefix ended in it
    text: str = ""
    spans: tuple[tuple[int, int, int], ...] = ()
    cached_chars: int | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.sections)

    def as_dict(self) -> dict[str, Any]:
        """`prompt_sections`, `sections_source` and `cache_break`, as `ask --json` and the
        exports carry them (the prompt text is not kept: the chat has it)."""
        return {
            "prompt_sections": [asdict(s) for s in self.sections],
            "sections_source": self.source,
            "cache_break": asdict(self.cache_break) if self.cache_break else None,
        }


def anatomy_from_dict(data: dict[str, Any]) -> Anatomy | None:
    """An `Anatomy` back from `as_dict()` (the chat database); None if unreadable."""
    try:
        sections = tuple(Section(**s) for s in data["prompt_sections"])
        brk = data.get("cache_break")
        return Anatomy(sections, str(data["sections_source"]), CacheBreak(**brk) if brk else None)
    except (KeyError, TypeError, ValueError):
        return None


# -- splitting ---------------------------------------------------------------------------


def locate(text: str, parts: Sequence[Part]) -> list[tuple[int, int]] | None:
    """Where each part's text lies in the templated `text`, in order (character spans);
    None when one cannot be found (a template that rewrites content)."""
    spans, at = [], 0
    for part in parts:
        body = part.text
        start = text.find(body, at) if body else at
        if start < 0:
            body = body.strip()
            start = text.find(body, at)
            if start < 0:
                return None
        spans.append((start, start + len(body)))
        at = start + len(body)
    return spans


def split_exact(
    text: str,
    pieces: Sequence[bytes],
    parts: Sequence[Part],
    cached: int | None,
    ms_per_token: float | None,
    source: str,
) -> Anatomy | None:
    """The sections of a prompt whose templated `text` the engine read as tokens with
    these `pieces` (each token's bytes, in order). A token belongs to the section its
    first byte lies in; tokens with no bytes in the text (a BOS) are the template's.
    `cached`: the engine's count of prompt tokens it had (None: not reported). None when
    the parts cannot be found in the text."""
    spans = locate(text, parts)
    if spans is None:
        return None
    raw = text.encode("utf-8")
    joined = b"".join(pieces)
    # A BOS (or any token the template text does not show) comes first: skip its bytes.
    shift = len(joined) - len(raw) if joined.endswith(raw) else 0
    if shift < 0 or (shift == 0 and joined != raw):
        return None
    byte_starts = [len(text[:s].encode("utf-8")) for s, _ in spans]
    byte_ends = [len(text[:e].encode("utf-8")) for _, e in spans]
    owner: list[int | None] = []  # per token: index of its part, None for the template
    pos = -shift
    for piece in pieces:
        start, pos = pos, pos + len(piece)
        if start < 0 or not piece:
            owner.append(None)
            continue
        i = bisect.bisect_right(byte_starts, start) - 1
        owner.append(i if i >= 0 and start < byte_ends[i] else None)
    sections = _tally(parts, owner, cached, ms_per_token)
    cached_chars = None
    if cached is not None:
        end = max(0, sum(len(p) for p in pieces[:cached]) - shift)
        cached_chars = len(raw[:end].decode("utf-8", errors="ignore"))
    index = {(s.kind, s.message_index): n for n, s in enumerate(sections)}
    shown = tuple(
        (s, e, index[(p.kind, p.message_index)]) for (s, e), p in zip(spans, parts, strict=True)
    )
    return Anatomy(sections, source, None, text, shown, cached_chars)


def split_estimated(
    parts: Sequence[Part],
    prompt_tokens: int,
    cached: int | None,
    ms_per_token: float | None,
    count: Callable[[str], int],
) -> Anatomy:
    """Sections from a token estimate of each part (`count`); the template gets what is
    left of the engine's `prompt_tokens`. The cached tokens are laid over them in order
    (the template's share spread before each part), so a section's cached count is as
    good as the estimate, and a server that counts its cache in blocks makes it coarser
    still: a boundary drawn here is never exact."""
    sizes = [count(p.text) for p in parts]
    over = sum(sizes) - prompt_tokens
    while over > 0 and any(sizes):  # the estimate ran over the real count: trim the largest
        i = sizes.index(max(sizes))
        cut = min(over, sizes[i])
        sizes[i] -= cut
        over -= cut
    template = prompt_tokens - sum(sizes)
    owner: list[int | None] = []
    per_part = template // len(parts) if parts else template
    left = template
    for i, size in enumerate(sizes):
        lead = per_part if i < len(sizes) - 1 else left
        left -= lead
        owner += [None] * lead + [i] * size
    owner += [None] * left
    return Anatomy(_tally(parts, owner, cached, ms_per_token), "estimate")


def _tally(
    parts: Sequence[Part],
    owner: Sequence[int | None],
    cached: int | None,
    ms_per_token: float | None,
) -> tuple[Section, ...]:
    """Per part (merging parts of one kind and message), then the template: tokens, and
    of them those before `cached` (the engine's cached prefix)."""
    keys: list[tuple[SectionKind, int | None]] = []
    for p in parts:
        if (p.kind, p.message_index) not in keys:
            keys.append((p.kind, p.message_index))
    keys.append(("template", None))
    slot = {k: n for n, k in enumerate(keys)}
    of_part = [slot[(p.kind, p.message_index)] for p in parts]
    tokens, hit = [0] * len(keys), [0] * len(keys)
    for i, part in enumerate(owner):
        n = of_part[part] if part is not None else len(keys) - 1
        tokens[n] += 1
        if cached is not None and i < cached:
            hit[n] += 1
    out = []
    for (kind, message_index), t, h in zip(keys, tokens, hit, strict=True):
        evaluated = t - h if cached is not None else None
        ms = evaluated * ms_per_token if evaluated is not None and ms_per_token else None
        out.append(
            Section(kind, message_index, t, h if cached is not None else None, evaluated, ms)
        )
    return tuple(out)


# -- cache breaks ------------------------------------------------------------------------


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b`: a binary search whose
    comparisons are C's (a long chat's prompt is compared at every turn)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def find_break(
    held: str,
    sent: str,
    spans: Sequence[tuple[int, int, int]],
    sections: Sequence[Section],
    tokens_read_again: int | None,
    estimated: bool,
    *,
    tokens: HeldTokens | None = None,
    grain: int = 1,
) -> CacheBreak | None:
    """Where `sent` (this prompt's text) first differs from `held` (the previous
    request's prompt and answer, as the engine held them); `spans` place the sections in
    `sent`. None when nothing the engine held was read again (a normal next turn), or
    fewer than BREAK_MIN_TOKENS of it. `tokens`: both sides' tokens, where known: a break
    there whose text is the same on both sides is a re-tokenization. A break with no
    difference in the text or the tokens means the engine held something else since;
    with no tokens known, only that it read some again ("unexplained"). `grain`: the
    engine's cache block (`reusable`), said with the break; `tokens_read_again` is
    counted beyond the held tokens' whole blocks already."""
    if tokens_read_again is not None and tokens_read_again < BREAK_MIN_TOKENS:
        return None
    at = common_prefix(held, sent)
    split = _token_split(tokens) if tokens is not None else None
    # a split placed by the engine's cached count alone is a re-tokenization only where
    # the whole held text (its answer's too) is the start of this prompt's
    if split is not None and split.same_text and (split.by_tokens or at == len(held)):
        message_index, offset = _place(split.char, spans, sections)
        in_answer = tokens is not None and split.char >= tokens.answer_at
        return CacheBreak(
            message_index,
            offset,
            split.held,
            split.sent,
            tokens_read_again,
            estimated,
            "retokenized",
            in_answer,
            grain,
        )
    if at == min(len(held), len(sent)):  # one is a prefix of the other
        if tokens_read_again is None or len(sent) < len(held):
            return None
        # the tokens agree as far as they are known: the engine held something else
        # since; with none known, the held text's being a prefix says nothing of why
        kind: BreakKind = "other" if tokens is not None else "unexplained"
        return CacheBreak(None, 0, "", "", tokens_read_again, estimated, kind, grain=grain)
    message_index, offset = _place(at, spans, sections)
    lo = max(0, at - AROUND // 2)
    return CacheBreak(
        message_index,
        offset,
        held[lo : at + AROUND],
        sent[lo : at + AROUND],
        tokens_read_again,
        estimated,
        grain=grain,
    )


@dataclass(frozen=True, slots=True)
class HeldTokens:
    """The tokens of a cache-break comparison, each as its bytes: what the engine held
    (`held`: the previous prompt's, then its answer's where known, `answer_known`) and
    what this prompt is (`sent`), with where the answer starts in the held text
    (`answer_at`, characters) and the engine's count of this prompt's tokens it reused
    (`cached`: where it began reading, None when it did not say)."""

    held: tuple[bytes, ...]
    sent: tuple[bytes, ...]
    answer_known: bool
    answer_at: int
    cached: int | None
    #: bytes before the text in both (a BOS whose piece the text does not show)
    shift: int = 0
    #: the engine caches whole blocks of this many tokens (`reusable`)
    grain: int = 1


@dataclass(frozen=True, slots=True)
class _Split:
    char: int  # where the tokens part, in the sent text (characters)
    held: str  # the held tokens from there until both sides meet on a boundary again,
    sent: str  # ... and this prompt's, each shown as "K|VC"
    same_text: bool  # the two runs of tokens spell the same bytes
    by_tokens: bool = True  # False: placed by the engine's cached count, not by tokens


def _token_split(t: HeldTokens) -> _Split | None:
    """Where the held tokens and the sent ones first part (None: they do not, as far as
    the held ones are known)."""
    k = 0
    for a, b in zip(t.held, t.sent, strict=False):
        if a != b:
            break
        k += 1
    if k < len(t.held) and k < len(t.sent):
        held_run, sent_run = _until_aligned(t.held[k:], t.sent[k:])
        hb, sb = b"".join(held_run), b"".join(sent_run)
        # the held tokens may end before both sides meet again: the start agrees
        same = hb == sb or (k + len(held_run) == len(t.held) and sb.startswith(hb))
        return _Split(_char_of(t, k), _shown(held_run), _shown(sent_run), same)
    grain = max(1, t.grain)
    if k < len(t.held) or t.answer_known or t.cached is None or t.cached < k // grain * grain:
        return None
    # the held prompt agrees whole and its answer's tokens are not known (a server):
    # the engine began reading at `cached`, inside the answer's text, or, caching whole
    # blocks, at the start of the block the held prompt ends in: then from the answer
    at = max(t.cached, k)
    if at >= len(t.sent):
        return None
    sent = _shown(t.sent[at : at + 2])
    return _Split(_char_of(t, at), "", sent, True, by_tokens=False)


def _until_aligned(
    a: Sequence[bytes], b: Sequence[bytes]
) -> tuple[Sequence[bytes], Sequence[bytes]]:
    """The shortest runs from the start of `a` and of `b` that end on the same byte
    (both sides meet on a token boundary again), or as far as the shorter goes."""
    i = j = 0
    na = nb = 0
    while i < len(a) and j < len(b):
        if na <= nb:
            na += len(a[i])
            i += 1
        else:
            nb += len(b[j])
            j += 1
        if na == nb:
            break
    return a[:i], b[:j]


def _shown(run: Sequence[bytes]) -> str:
    """Tokens as "K|VC" (at most AROUND characters of each)."""
    return "|".join(p.decode("utf-8", errors="replace")[:AROUND] for p in run[:8])


def _char_of(t: HeldTokens, k: int) -> int:
    """Where token `k` of the sent prompt starts in its text, in characters."""
    joined = b"".join(t.sent[:k])[t.shift :]
    return len(joined.decode("utf-8", errors="ignore"))


def _place(
    at: int, spans: Sequence[tuple[int, int, int]], sections: Sequence[Section]
) -> tuple[int | None, int]:
    """The message that character `at` of the prompt lies in (or the next one after
    it), and the offset in that message's text."""
    for start, end, n in spans:
        if at < end or start > at:
            return sections[n].message_index, max(0, at - start)
    return None, at
