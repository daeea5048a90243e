"""A metric set or a prompt anatomy read back from disk (the chat database), checked
before it is believed.

What was written is a claim by the time it is read: another program, a damaged disk or
an older phasechat may have left anything in the cell. A record that is not an object,
or whose required counts are not counts, is unreadable as a whole (`Unreadable`, one
line saying why). Within a readable metric set each figure is checked as the wire's
figures are (backends/remote/wire_numbers.py), by the bound its field declares beside it
(telemetry/bounds.py): a count is a count, a time a week at most, a rate below
belief's limit, a share in 0-1; a figure that fails is unknown (None) and
named in `Metrics.ignored`, so a view shows "unknown" and a JSON export `null`, never
NaN, infinity or a negative time. An anatomy with one implausible figure is unreadable
whole: its sections are sums of one another, and a part cannot be trusted alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from types import UnionType
from typing import Any, Union, cast, get_args, get_origin, get_type_hints

from phasechat.backends.remote.wire_numbers import MAX_TOKENS, as_count, as_ms
from phasechat.backends.untrusted import shown, text_in
from phasechat.telemetry.anatomy import (
    Anatomy,
    BreakKind,
    CacheBreak,
    Section,
    SectionKind,
)
from phasechat.telemetry.bounds import MAX_BYTES as MAX_BYTES
from phasechat.telemetry.bounds import MAX_CHARS_PER_TOKEN as MAX_CHARS_PER_TOKEN
from phasechat.telemetry.bounds import MAX_GB_S as MAX_GB_S
from phasechat.telemetry.bounds import Bound
from phasechat.telemetry.metric_set import Metrics, flat_names, metrics_from_dict

#: Fields without which a metric set means nothing: not a count, and it is unreadable.
_REQUIRED_COUNTS = ("output_tokens", "chars")

#: What was not plausible: checked values come back as themselves or as this.
_BAD = object()


class Unreadable(ValueError):
    """A record read back that cannot be believed at all; the message says why."""


def metrics_read_back(data: object) -> Metrics:
    """The metric set a stored `Metrics.as_dict()` claims, every figure checked: an
    implausible one is None and named in `ignored`. Raises `Unreadable` when `data` is
    not an object or `output_tokens`/`chars` is not a count."""
    if not isinstance(data, dict):
        raise Unreadable(f"its metrics are {shown(data)}, not an object")
    clean: dict[str, Any] = {}
    ignored: list[str] = []
    for name, check in _checks().items():
        if name not in data:
            continue
        value = data[name]
        checked = check(value)
        if checked is not _BAD:
            clean[name] = checked
        elif name in _REQUIRED_COUNTS:
            raise Unreadable(f"its metrics' {name} is {shown(value)}, not a count")
        else:
            ignored.append(f"{name} ({shown(value)})")
    return metrics_from_dict({**clean, "ignored": ignored})


@functools.cache
def _checks() -> dict[str, Callable[[object], object]]:
    """Each stored field of `Metrics` (in its order) and how a value read back for it is
    checked: worked out once from the field's declared type, not at every message of a
    5,000-message chat (it halved the opening of one: bench/long_chat.py)."""
    checks = checks_of(Metrics, skip=("ignored",))
    return {name: checks[name] for name in flat_names()}


def checks_of(
    record: type[Any], skip: tuple[str, ...] = ()
) -> dict[str, Callable[[object], object]]:
    """The check of each field of the dataclass `record` (in its order, less `skip`):
    a number by the `Bound` its type declares (telemetry/bounds.py), whatever its name;
    a flag, a text or a list of lines by its type; a field that is itself a record
    (`Metrics.timing`) by its own fields' checks, in its place. Raises `TypeError` for
    a number that declares no bound, or a type no check reads."""
    hints = get_type_hints(record, include_extras=True)
    out: dict[str, Callable[[object], object]] = {}
    for f in fields(record):
        if f.name in skip:
            continue
        if is_dataclass(hints[f.name]):
            out |= checks_of(hints[f.name])
        else:
            out[f.name] = _check_for(f.name, hints[f.name])
    return out


def _check_for(name: str, hint: object) -> Callable[[object], object]:
    """The check of field `name` of type `hint`: a value it may hold comes back as itself
    (None for an optional one's null), any other as `_BAD`."""
    args = get_args(hint)
    optional = get_origin(hint) in (Union, UnionType) and type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else hint
    inner: Callable[[object], object]
    bound = next((b for b in getattr(base, "__metadata__", ()) if isinstance(b, Bound)), None)
    if bound is not None:
        inner = bound.check
    elif base in (int, float):
        raise TypeError(f"{name} is a number that declares no bound (telemetry/bounds.py)")
    elif base is bool:
        inner = lambda v: v if isinstance(v, bool) else None  # noqa: E731
    elif base is str:
        inner = lambda v: v if _is_text(v) else None  # noqa: E731
    elif base == tuple[str, ...]:  # the warnings: a list of lines
        inner = lambda v: (  # noqa: E731
            tuple(v) if isinstance(v, list) and all(_is_text(w) for w in v) else None
        )
    else:
        raise TypeError(f"{name}: no check reads a {hint}")

    def check(value: object) -> object:
        if value is None:
            return None if optional else _BAD
        checked = inner(value)
        return _BAD if checked is None else checked

    return check


def anatomy_read_back(data: object) -> Anatomy:
    """The anatomy a stored `Anatomy.as_dict()` claims; raises `Unreadable` when a
    section or the cache break holds anything but plausible figures and text."""
    if not isinstance(data, dict):
        raise Unreadable(f"its prompt anatomy is {shown(data)}, not an object")
    raw = data.get("prompt_sections")
    if not isinstance(raw, list):
        raise Unreadable(f"its prompt sections are {shown(raw)}, not a list")
    sections = tuple(_section(s) for s in raw)
    source = data.get("sections_source")
    if not _is_text(source):
        raise Unreadable(f"its prompt anatomy's source is {shown(source)}")
    brk = data.get("cache_break")
    return Anatomy(sections, str(source), _cache_break(brk) if brk is not None else None)


def _section(s: object) -> Section:
    if not isinstance(s, dict):
        raise Unreadable(f"a prompt section is {shown(s)}, not an object")
    tokens = _need(s, "tokens")
    cached, evaluated = _count(s, "cached_tokens", True), _count(s, "evaluated_tokens", True)
    for part, value in (("cached_tokens", cached), ("evaluated_tokens", evaluated)):
        if value is not None and value > tokens:
            raise Unreadable(f"a prompt section's {part} ({value:,}) exceed its tokens")
    kind = s.get("kind")
    if kind not in get_args(SectionKind):
        raise Unreadable(f"a prompt section's kind is {shown(kind)}")
    ms = s.get("prefill_ms")
    if ms is not None and as_ms(ms) is None:
        raise Unreadable(f"a prompt section's prefill_ms is {shown(ms)}")
    index = _count(s, "message_index", True)
    return Section(cast(SectionKind, kind), index, tokens, cached, evaluated, as_ms(ms))


def _cache_break(b: object) -> CacheBreak:
    if not isinstance(b, dict):
        raise Unreadable(f"its cache break is {shown(b)}, not an object")
    held, sent, kind = b.get("held"), b.get("sent"), b.get("kind", "edit")
    flags = (b.get("estimated"), b.get("in_answer", False))
    if not (_is_text(held) and _is_text(sent)) or kind not in get_args(BreakKind):
        raise Unreadable("its cache break's text or kind is not plausible")
    if not all(isinstance(f, bool) for f in flags):
        raise Unreadable("its cache break's flags are not true or false")
    return CacheBreak(
        _count(b, "message_index", True),
        _need(b, "char_offset", limit=2**40),
        str(held),
        str(sent),
        _count(b, "tokens_read_again", True),
        bool(flags[0]),
        cast(BreakKind, kind),
        bool(flags[1]),
        _grain(b),
    )


def _grain(b: dict[str, object]) -> int:
    """A break's cache block (1 where a chat saved before it was kept); raises
    `Unreadable` for anything but a positive count."""
    if b.get("grain") is None:
        return 1
    grain = _need(b, "grain")
    if grain < 1:
        raise Unreadable("its cache break's block size is 0")
    return grain


def _count(obj: dict[str, object], key: str, optional: bool) -> int | None:
    """`obj[key]` as a count, or None when it is null and `optional`; raises `Unreadable`."""
    if obj.get(key) is None and optional:
        return None
    return _need(obj, key)


def _need(obj: dict[str, object], key: str, limit: int = MAX_TOKENS) -> int:
    """`obj[key]` as a count in 0..`limit`; raises `Unreadable`."""
    value = obj.get(key)
    checked = as_count(value, limit)
    if checked is None:
        raise Unreadable(f"its prompt anatomy's {key} is {shown(value)}, not a count")
    return checked


def _is_text(value: object) -> bool:
    return text_in(value) is not None
