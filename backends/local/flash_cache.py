"""The flash-attention choice as kept on disk (`flash-attn.json` in the cache directory),
and checked when read back.

An entry is believed only when every field is what backends/local/flash.py writes: a bool, two
step times in milliseconds that are finite and positive (`MAX_MS` at most), a UTC time in
`STAMP`'s form, and the other processes' share of the CPUs during the measurement,
below `measured.BUSY` (a busy one is kept as provisional: used, labelled, while the
machine stays busy, never written over a quiet one, and measured again by the first load
that finds the machine quiet). Off is chosen only where off measured faster. Anything else is
ignored and measured again, with a notice naming the file. An entry written before the
share was noted, or marked stale (its figures disagreed with the answers since), is
measured again without a notice: it is not damaged, only not trusted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from phasechat.backends.local.measured import (
    busy,
    ignored,
    read_entries,
    share_text,
    write_entries,
)
from phasechat.backends.untrusted import number_in, shown

#: a decode step longer than a minute is not one this machine took
MAX_MS = 60_000.0
#: how `measured_at` is written (UTC)
STAMP = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class FlashChoice:
    """The choice, and the measurement behind it (step times in ms, medians)."""

    flash_attn: bool
    on_ms: float
    off_ms: float
    measured_at: str  # UTC, `STAMP`
    cached: bool = False
    #: other processes' share (0-1) of the CPUs while it was measured (None: unknown)
    others: float | None = None

    @property
    def busy(self) -> bool:
        """Measured beside a busy neighbour: provisional, never the fact."""
        return busy(self.others)

    @property
    def ms(self) -> float:
        """The step time measured for the setting chosen."""
        return self.on_ms if self.flash_attn else self.off_ms

    @property
    def summary(self) -> str:
        """One line: "flash attention off (measured: 1.06x faster decode than on)"."""
        state = "on" if self.flash_attn else "off"
        when = "cached measurement" if self.cached else "measured at load"
        if self.flash_attn:
            why = f"off was not faster: {self.on_ms / self.off_ms:.2f}x"
        else:
            why = f"{self.on_ms / self.off_ms:.2f}x faster decode than on"
        line = f"flash attention {state} ({when} {self.measured_at[:10]}: {why}"
        if self.busy:
            return f"{line}; {share_text(self.others)}: provisional, measured again when quiet)"
        return line + ")"


def cache_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("phasechat")) / "flash-attn.json"


def read(key: str) -> tuple[FlashChoice | None, str | None]:
    """The kept choice for `key` (None: none, or not trusted; a busy one is provisional,
    `busy`), and a notice when the file or the entry was ignored."""
    path = cache_file()
    data, problem = read_entries(path)
    if problem is not None:
        return None, ignored(path, problem)
    if key not in data:
        return None, None
    entry = data[key]
    if not isinstance(entry, dict):
        return None, ignored(path, "this model's entry is not an object")
    checked = _checked(entry)
    if isinstance(checked, str):
        return None, ignored(path, f"this model's {checked}")
    # no "others": written before the share was noted (as the entry that chose off
    # beside a compiler was); null: noted, but unknown (off Linux)
    trusted = "others" in entry and not entry.get("stale")
    return (checked if trusted else None), None


def _checked(entry: dict[str, object]) -> FlashChoice | str:
    """The entry as a choice, or what is wrong with it."""
    flash_attn = entry.get("flash_attn")
    if not isinstance(flash_attn, bool):
        return f"flash_attn {shown(flash_attn)} is not true or false"
    ms = {name: number_in(entry.get(name), 1e-6, MAX_MS) for name in ("on_ms", "off_ms")}
    for name, value in ms.items():
        if value is None:
            return f"{name} {shown(entry.get(name))} is not a step time"
    on_ms, off_ms = ms["on_ms"], ms["off_ms"]
    assert on_ms is not None and off_ms is not None
    if not flash_attn and off_ms >= on_ms:
        return f"flash_attn false is not what on_ms {on_ms} and off_ms {off_ms} say"
    at = entry.get("measured_at")
    if not isinstance(at, str) or not _stamp(at):
        return f"measured_at {shown(at)} is not a time of the form {STAMP}"
    others = entry.get("others")
    share = None if others is None else number_in(others, 0.0, 1.0)
    if others is not None and share is None:
        return f"others {shown(others)} is not a share of the CPUs"
    return FlashChoice(flash_attn, on_ms, off_ms, at, cached=True, others=share)


def _stamp(text: str) -> bool:
    try:
        time.strptime(text, STAMP)
    except ValueError:
        return False
    return True


def store(key: str, choice: FlashChoice) -> None:
    """Keep `choice` for `key`; a busy measurement only as provisional, never over a
    quiet one (contention does not make a fact)."""
    data, _ = read_entries(cache_file())
    if choice.busy and _a_fact(data.get(key)):
        return
    data[key] = {
        "flash_attn": choice.flash_attn,
        "on_ms": choice.on_ms,
        "off_ms": choice.off_ms,
        "measured_at": choice.measured_at,
        "others": choice.others,
    }
    write_entries(cache_file(), data)


def _a_fact(entry: object) -> bool:
    """An entry that holds a quiet, trusted measurement."""
    if not isinstance(entry, dict) or "others" not in entry or entry.get("stale"):
        return False
    checked = _checked(entry)
    return not isinstance(checked, str) and not checked.busy


def mark_stale(key: str) -> None:
    """Mark `key`'s entry stale: the next load measures again."""
    path = cache_file()
    data, problem = read_entries(path)
    entry = data.get(key)
    if problem is None and isinstance(entry, dict):
        entry["stale"] = True
        write_entries(path, data)
