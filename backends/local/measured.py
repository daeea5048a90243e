"""Measurements kept on disk between runs, and checked before they are believed.

Two measurements are cached (the memory bandwidth, chat/roofline.py; the flash-attention
choice, backends/local/flash_cache.py), each a JSON object of entries keyed by what was
measured. Both follow the same rules:

- A measurement notes how much of the CPUs other processes used while it ran
  (`others_during`). Above `BUSY` it was taken beside a build or a test run: it may
  serve the run that took it, labelled, but it is never written as the fact.
- What is read back is a claim, not a fact: a file that is not a JSON object, or an
  entry whose fields are not finite, positive and physically plausible
  (backends/untrusted.py), is ignored, and measured again, with a notice that names the
  file (`ignored`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from phasechat.backends.local.threads import CpuShare

#: other processes used more than this share of our CPUs: the measurement is not kept
BUSY = 0.25

T = TypeVar("T")


def others_during(
    measure: Callable[[], T], share: Callable[[], CpuShare] = CpuShare
) -> tuple[T, float | None]:
    """`measure()`, and the share (0-1) of this process's CPUs that other processes used
    meanwhile (None: unknown, off Linux or too short a span to tell)."""
    cpu = share()
    result = measure()
    idle = cpu.idle_share()
    return result, None if idle is None else min(1.0, max(0.0, 1.0 - idle))


def busy(others: float | None) -> bool:
    """Whether a measurement taken while others used `others` of the CPUs is unfit to keep
    (unknown is not busy: off Linux nothing could be kept otherwise)."""
    return others is not None and others > BUSY


def share_text(others: float | None) -> str:
    """ "other processes used 52% of the CPUs", or that it is not known."""
    if others is None:
        return "the other processes' share of the CPUs unknown"
    return f"other processes used {others:.0%} of the CPUs"


def read_entries(path: Path) -> tuple[dict[str, object], str | None]:
    """The entries of a cache file, and why the file was ignored (None: it was fine, or
    there is none yet)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"unreadable ({exc.strerror or exc.__class__.__name__})"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return {}, "not JSON (truncated or damaged)"
    if not isinstance(data, dict):
        return {}, f"a JSON {type(data).__name__}, not an object of entries"
    return data, None


def write_entries(path: Path, data: dict[str, object]) -> None:
    """Replace the cache file with `data` (best effort: a cache that cannot be written
    only costs a measurement next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


def ignored(path: Path, why: str) -> str:
    """The notice for a cache entry (or file) that was not believed."""
    return f"ignored {path}: {why}; measured again"
