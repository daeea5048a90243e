"""The machine's side of the roofline: its memory bandwidth (probed once, cached on disk
by machine) and how much memory is free for a model's KV cache.

The probe itself is telemetry/membw.py; this module keeps its result in phasechat's
cache directory (`bandwidth.json`, one entry per machine key: host name, CPU model,
core count and total memory), so a second run, `doctor`, `ask --stats` and the UI read
it instead of probing again. A changed machine (other CPU or memory) gets a new key and
a new probe.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phasechat.backends.gguf import Geometry
from phasechat.chat.config.paths import cache_dir
from phasechat.telemetry.membw import probe_bandwidth

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """A measured memory bandwidth and where it came from."""

    gb_s: float
    measured_at: float  # time.time() of the probe
    cached: bool  # read from the cache file rather than probed now


def _meminfo(field: str, meminfo: Path = MEMINFO) -> int | None:
    """A /proc/meminfo field in bytes (None where there is no such file or field)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == field:
            parts = rest.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return None


def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable)."""
    return _meminfo("MemAvailable", meminfo)


def machine_key() -> str:
    """Names this machine for the cache: host, CPU model, cores, total memory."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    parts = [platform.node(), platform.machine(), cpu or platform.processor()]
    parts += [str(os.cpu_count()), str(_meminfo("MemTotal"))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def bandwidth_file() -> Path:
    return cache_dir() / "bandwidth.json"


def cached_bandwidth(path: Path | None = None) -> Bandwidth | None:
    """This machine's bandwidth from the cache file, None when not measured yet."""
    path = path or bandwidth_file()
    try:
        entry = json.loads(path.read_text()).get(machine_key())
        return Bandwidth(float(entry["gb_s"]), float(entry["measured_at"]), cached=True)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def machine_bandwidth(
    path: Path | None = None, probe: Callable[[], float] = probe_bandwidth
) -> Bandwidth:
    """This machine's bandwidth: from the cache, else probed now (about 0.3 s) and
    written there. A cache that cannot be written only costs a probe next time."""
    path = path or bandwidth_file()
    known = cached_bandwidth(path)
    if known is not None:
        return known
    measured = Bandwidth(probe(), time.time(), cached=False)
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[machine_key()] = {"gb_s": measured.gb_s, "measured_at": measured.measured_at}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass
    return measured


def largest_context(g: Geometry, weights_bytes: int, available: int) -> int:
    """The largest n_ctx whose f16 KV cache fits in `available` bytes beside the weights
    (llama.cpp's compute buffers come on top: a few hundred MiB at most for small
    models). 0 when the weights alone do not fit."""
    per_token = g.kv_bytes(1, 1)  # every layer holds every cell (swa_full, the default)
    room = available - weights_bytes
    if room <= 0 or per_token <= 0:
        return 0
    return room // per_token
