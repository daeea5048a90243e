"""The machine's side of the roofline: its memory bandwidth (probed, cached on disk by
machine), the GPU's (backends/local/cuda.py, measured once a run) where an answer read from
one, and how much memory is free for a model's KV cache.

The probe itself is telemetry/membw.py (every core copying at once); this module keeps
its result in phasechat's cache directory (`bandwidth.json`, one entry per machine key:
host name, CPU model, core count and total memory), so a second run, `ask --stats` and
the UI read it instead of probing again. A changed machine gets a new key and a probe.

Contention only ever lowers a bandwidth, so the entry is the best ever seen here: a
probe taken while other processes used more than `measured.BUSY` of the CPUs serves
this run (labelled) but is not written; a lower probe never replaces a higher entry, a
higher one does. An entry is checked when read: a figure that is not a finite number of
GB/s in `LOWEST`..`HIGHEST`, or a time that is not one time.time() gave since 2020, is
ignored and probed again, with a notice naming the file. An entry from before the probe
used every core and noted the load is probed again once (and kept if it is the higher).
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from phasechat.backends.local.cuda import Gpus, gpus
from phasechat.backends.local.gguf import Geometry
from phasechat.backends.local.measured import (
    busy,
    ignored,
    read_entries,
    write_entries,
)
from phasechat.backends.local.offload import Split
from phasechat.backends.untrusted import number_in, shown
from phasechat.chat.config.paths import cache_dir
from phasechat.telemetry.membw import Probed, probe_bandwidth
from phasechat.telemetry.metrics import Metrics

MEMINFO = Path("/proc/meminfo")
#: GB/s believed: below, no machine that runs a model; above, beyond any memory today
LOWEST, HIGHEST = 0.1, 20_000.0
#: the earliest `measured_at` believed (2020-01-01 UTC): a time.time(), as written here
EPOCH = 1_577_836_800.0


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """A memory bandwidth and where it came from."""

    gb_s: float
    measured_at: float  # time.time() of the probe
    cached: bool  # read from the cache file rather than probed now
    threads: int = 1  # how many threads copied at once
    #: other processes' share (0-1) of the CPUs during the probe (None: unknown)
    others: float | None = None
    #: a cache entry or file that was ignored, naming the file
    notice: str | None = None
    #: the probe this call ran, where the figure above is another (a higher one kept)
    probed: Probed | None = None

    @property
    def busy(self) -> bool:
        """Probed beside a busy neighbour: for this run only, never kept."""
        return busy(self.others)

    @property
    def trust(self) -> str:
        """How far to trust the figure, for the roofline's line ('' : as measured)."""
        return "probed on a busy machine, not kept" if self.busy else ""


#: probes taken on a busy machine, by cache file: for the rest of this run, not written
_THIS_RUN: dict[Path, Bandwidth] = {}
#: the GPUs found and measured, once a run (a copy takes milliseconds; a GPU's memory is
#: not shared with a compiler the way the host's is, so there is nothing to keep on disk)
_GPUS: list[Gpus] = []


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The bandwidths an answer's roofline divides by (GB/s; None: not needed, or not
    known), each with its label, and a notice (a kept figure that was ignored)."""

    cpu_gb_s: float | None = None
    cpu_label: str = ""
    gpu_gb_s: float | None = None
    gpu_label: str = ""
    notice: str | None = None


def ceilings(
    m: Metrics,
    cpu: Callable[[], Bandwidth] | None = None,
    gpu: Callable[[], Gpus | None] | None = None,
) -> Ceilings:
    """The bandwidths `m`'s roofline needs, found only where it needs them: the host's
    (cached, else probed: about a second) for reads from host memory, the GPU's for
    reads from a GPU (measured once a run)."""
    on_gpu = m.gpu_bytes_per_token is not None
    needs_cpu = bool(m.cpu_bytes_per_token) if on_gpu else bool(m.implied_bandwidth_gb_s)
    found = Ceilings()
    if needs_cpu:
        bw = (cpu or machine_bandwidth)()
        found = Ceilings(bw.gb_s, bw.trust, notice=bw.notice)
    if on_gpu:
        device = (gpu or gpu_devices)()
        fastest = device.fastest() if device is not None else None
        if fastest is not None and device is not None:
            label = fastest.how + (
                f", the fastest of {len(device.devices)}" if len(device.devices) > 1 else ""
            )
            found = replace(found, gpu_gb_s=fastest.gb_s, gpu_label=label)
    return found


def gpu_devices() -> Gpus | None:
    """This process's CUDA devices with their bandwidth measured, once a run; None
    until llama.cpp's CUDA backend is loaded (and on a build without one)."""
    if not _GPUS:
        found = gpus()
        if found is None:
            return None
        _GPUS.append(found)
    return _GPUS[0]


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
    """This machine's kept bandwidth, None when not measured yet (or not trusted)."""
    kept, final, _ = _kept(path or bandwidth_file())
    return kept if final else None


def _kept(path: Path) -> tuple[Bandwidth | None, bool, str | None]:
    """This machine's entry (None: none, or not believed), whether it is final (from
    the all-cores probe, on a quiet machine), and a notice when something was ignored."""
    data, problem = read_entries(path)
    if problem is not None:
        return None, False, ignored(path, problem)
    entry = data.get(machine_key())
    if entry is None:
        return None, False, None
    if not isinstance(entry, dict):
        return None, False, ignored(path, "this machine's entry is not an object")
    checked = _checked(entry)
    if isinstance(checked, str):
        return None, False, ignored(path, f"this machine's {checked}")
    return checked, "others" in entry and not checked.busy, None


def _checked(entry: dict[str, object]) -> Bandwidth | str:
    """The entry as a bandwidth, or what is wrong with it."""
    gb_s = number_in(entry.get("gb_s"), LOWEST, HIGHEST)
    if gb_s is None:
        bounds = f"{LOWEST}..{HIGHEST:.0f} GB/s"
        return f"gb_s {shown(entry.get('gb_s'))} is not a bandwidth in {bounds}"
    at = number_in(entry.get("measured_at"), EPOCH, time.time() + 86_400)
    if at is None:
        return f"measured_at {shown(entry.get('measured_at'))} is not a time.time() since 2020"
    threads = entry.get("threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 65_536:
        return f"threads {shown(threads)} is not a count of threads"
    others = entry.get("others")
    share = None if others is None else number_in(others, 0.0, 1.0)
    if others is not None and share is None:
        return f"others {shown(others)} is not a share of the CPUs"
    return Bandwidth(gb_s, at, cached=True, threads=threads, others=share)


def machine_bandwidth(
    path: Path | None = None,
    probe: Callable[[], Probed] = probe_bandwidth,
    *,
    fresh: bool = False,
) -> Bandwidth:
    """This machine's bandwidth: the kept entry, else probed now (about a second) and
    kept unless the machine was busy. `fresh` (doctor): probe even when an entry is
    kept; the best of the two is the answer, and the only one written."""
    path = path or bandwidth_file()
    kept, final, notice = _kept(path)
    if kept is not None and final and not fresh:
        return kept
    if path in _THIS_RUN and not fresh:
        return _THIS_RUN[path]
    seen = probe()
    now = Bandwidth(seen.gb_s, time.time(), False, seen.threads, seen.others, notice)
    if number_in(now.gb_s, LOWEST, HIGHEST) is None:  # a probe that went wrong
        return kept or now
    best = now if kept is None or now.gb_s > kept.gb_s else replace(kept, probed=seen)
    if now.busy:
        _THIS_RUN[path] = best
        return best
    data, _ = read_entries(path)
    data[machine_key()] = {
        "gb_s": best.gb_s,
        "measured_at": best.measured_at,
        "threads": best.threads,
        "others": best.others,
    }
    write_entries(path, data)
    return best


def largest_context(g: Geometry, weights_bytes: int, available: int) -> int:
    """The largest n_ctx whose f16 KV cache fits in `available` bytes beside the weights
    (llama.cpp's compute buffers come on top: a few hundred MiB at most for small
    models). 0 when the weights alone do not fit."""
    per_token = g.kv_bytes(1, 1)  # every layer holds every cell (swa_full, the default)
    room = available - weights_bytes
    if room <= 0 or per_token <= 0:
        return 0
    return room // per_token


def largest_context_offloaded(
    g: Geometry, where: Split, gpu_free: int, host_free: int | None
) -> tuple[int, str]:
    """With layers on a GPU (`where`, its bytes the weights alone): the largest n_ctx
    whose f16 KV cache fits, each layer's share of it beside the weights on its side:
    the GPU's free memory for the offloaded layers, the host's (None: unknown, not
    counted) for the rest; and the side that sets it, "GPU" or "host". 0 when the
    weights alone do not fit (compute buffers come on top, as in `largest_context`)."""
    per_token = g.kv_bytes(1, 1)
    gpu_token = per_token * where.gpu_layers // where.n_layers if where.n_layers else 0
    sides = [("GPU", gpu_free - where.gpu_bytes, gpu_token)]
    if where.partial and host_free is not None:
        sides.append(("host", host_free - (g.file_bytes - where.gpu_bytes), per_token - gpu_token))
    fits: tuple[int, str] | None = None
    for side, room, per in sides:
        if room <= 0:
            return 0, side
        if per > 0 and (fits is None or room // per < fits[0]):
            fits = (room // per, side)
    return fits or (0, "GPU")
