"""The GPU's side of the roofline, from the CUDA runtime that the loaded llama.cpp build
links, through ctypes: its devices, their free memory and their memory bandwidth.

The bandwidth is measured: a timed device-to-device copy of `COPY_BYTES`, `COPIES` at a
time, best of `ROUNDS`, each copy reading and writing `COPY_BYTES` (2 x size / time, as
the CPU's probe counts, telemetry/membw.py). Where the copy cannot run, the device's own
figure stands in, labelled as a specification: 2 x memory clock x bus width / 8 (double
data rate). Every figure is checked: a bandwidth outside `LOWEST_GB_S`..`HIGHEST_GB_S`,
a copy faster than the memory's own rate, or free memory above the total, is unknown.

Only a process that has loaded llama.cpp's CUDA backend has a GPU here: the runtime is
the libcudart in this process's memory map (libggml-cuda links it), else, when
libggml-cuda is loaded with the runtime linked in, the system's libcudart. A CPU build
has no libggml-cuda, so no GPU, whatever the machine holds. Nothing here runs at import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAPS = Path("/proc/self/maps")
#: 256 MiB: several times the L2 cache of any GPU (50 MiB on an H100), small beside its memory
COPY_BYTES = 256 * 2**20
#: copies queued between two synchronisations, so the launch and the wait are a small share
COPIES = 8
ROUNDS = 5
#: GB/s believed for a GPU's memory: below, no GPU that runs a model; above, no memory today
LOWEST_GB_S, HIGHEST_GB_S = 10.0, 50_000.0
#: a measured copy this much faster than the specification is a timing that missed the copy
BEYOND_SPEC = 1.05
#: bytes of memory believed for one device (1 PiB)
MOST_BYTES = 2**50
# cuda_runtime_api.h
MEMCPY_DEVICE_TO_DEVICE = 3
ATTR_MEMORY_CLOCK_KHZ = 36  # cudaDevAttrMemoryClockRate
ATTR_BUS_WIDTH_BITS = 37  # cudaDevAttrGlobalMemoryBusWidth
#: larger than any cudaDeviceProp (1,008 bytes in CUDA 12): its first field is name[256]
PROPS_BYTES = 8192


class CudaError(Exception):
    """A CUDA runtime call failed; the message names the call and the error."""


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU: its name, memory (None: unknown) and memory bandwidth (GB/s, 1e9 bytes),
    as specified (clock x bus width) and as measured by a copy (None: not measured)."""

    index: int
    name: str
    free_bytes: int | None
    total_bytes: int | None
    spec_gb_s: float | None
    copy_gb_s: float | None = None
    #: why the copy was not measured ('' : it was, or was not asked for)
    copy_problem: str = ""

    @property
    def gb_s(self) -> float | None:
        """The measured bandwidth, else the specification's; None: neither is known."""
        return self.copy_gb_s if self.copy_gb_s is not None else self.spec_gb_s

    @property
    def how(self) -> str:
        """Where `gb_s` comes from, for the roofline's line."""
        if self.copy_gb_s is not None:
            return f"{self.name}, measured by a device-to-device copy"
        if self.spec_gb_s is not None:
            return f"{self.name}'s specification (memory clock x bus width), not measured"
        return f"{self.name}: unknown"


@dataclass(frozen=True, slots=True)
class Gpus:
    """The CUDA runtime found and its devices."""

    runtime: str  # the library's path (or name)
    version: str  # the runtime's version, e.g. "12.4" ('' : unknown)
    devices: tuple[Device, ...]

    def fastest(self) -> Device | None:
        """The device whose memory moves the most (the roofline's ceiling: decode
        cannot read faster than that); None when no bandwidth is known."""
        known = [d for d in self.devices if d.gb_s is not None]
        return max(known, key=lambda d: d.gb_s or 0.0) if known else None


def runtime_path(maps: Path = MAPS) -> str | None:
    """The libcudart this process has loaded, or the system's when libggml-cuda is loaded
    without one (linked in); None when llama.cpp's CUDA backend is not loaded."""
    try:
        text = maps.read_text(errors="replace")
    except OSError:
        return None
    paths = set()
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.add(parts[5].removesuffix(" (deleted)"))
    runtimes = sorted(p for p in paths if Path(p).name.startswith("libcudart.so"))
    if runtimes:
        return runtimes[0]
    if any(Path(p).name.startswith("libggml-cuda") for p in paths):
        return ctypes.util.find_library("cudart")
    return None


def load_runtime(maps: Path = MAPS) -> tuple[str, Any] | None:
    """The CUDA runtime's path and the library, declared; None: no CUDA here."""
    path = runtime_path(maps)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        _declare(lib)
    except (OSError, AttributeError):  # not a library, or not the runtime (a call missing)
        return None
    return path, lib


def _declare(lib: Any) -> None:
    """The signatures of the calls used (cuda_runtime_api.h), so ctypes passes each
    argument at its C width."""
    p_int, p_size, p_ptr = (
        ctypes.POINTER(t) for t in (ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p)
    )
    signatures: dict[str, list[Any]] = {
        "cudaGetDeviceCount": [p_int],
        "cudaRuntimeGetVersion": [p_int],
        "cudaSetDevice": [ctypes.c_int],
        "cudaDeviceGetAttribute": [p_int, ctypes.c_int, ctypes.c_int],
        "cudaMemGetInfo": [p_size, p_size],
        "cudaMalloc": [p_ptr, ctypes.c_size_t],
        "cudaFree": [ctypes.c_void_p],
        "cudaMemset": [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t],
        "cudaMemcpy": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int],
        "cudaDeviceSynchronize": [],
    }
    for name, args in signatures.items():
        func = getattr(lib, name)
        func.argtypes, func.restype = args, ctypes.c_int
    for name in ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"):
        func = getattr(lib, name, None)
        if func is not None:
            func.argtypes, func.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
    lib.cudaGetErrorString.argtypes, lib.cudaGetErrorString.restype = (
        [ctypes.c_int],
        ctypes.c_char_p,
    )


def _call(lib: Any, name: str, *args: Any) -> None:
    """Call `name`; raise CudaError naming it and the error unless it succeeded."""
    rc = int(getattr(lib, name)(*args))
    if rc != 0:
        try:
            text = (lib.cudaGetErrorString(rc) or b"").decode("utf-8", "replace")
        except Exception:  # a library without it: the number says enough
            text = ""
        raise CudaError(f"{name}: CUDA error {rc}" + (f" ({_printable(text)})" if text else ""))


def gpus(maps: Path = MAPS, *, measure: bool = True) -> Gpus | None:
    """The CUDA devices llama.cpp's backend can use, with their bandwidth measured by a
    copy (`measure`; about a tenth of a second a device); None: no CUDA backend loaded,
    or a runtime that cannot count its devices."""
    found = load_runtime(maps)
    if found is None:
        return None
    return read_gpus(found[1], found[0], measure=measure)


def read_gpus(
    lib: Any, runtime: str, *, measure: bool = True, clock: Callable[[], float] = time.perf_counter
) -> Gpus | None:
    """`gpus` on a loaded runtime (a real one, or a stand-in in tests, with its clock)."""
    count = ctypes.c_int(0)
    try:
        _call(lib, "cudaGetDeviceCount", ctypes.pointer(count))
    except CudaError:
        return None
    if not 0 < count.value <= 1024:
        return None
    found = tuple(device(lib, i, measure=measure, clock=clock) for i in range(count.value))
    return Gpus(runtime, _version(lib), found)


def _version(lib: Any) -> str:
    """The runtime's version as CUDA writes it, 12040 -> "12.4" ('' : unknown)."""
    v = ctypes.c_int(0)
    try:
        _call(lib, "cudaRuntimeGetVersion", ctypes.pointer(v))
    except CudaError:
        return ""
    return f"{v.value // 1000}.{v.value % 1000 // 10}" if 1000 <= v.value < 1_000_000 else ""


def device(
    lib: Any, index: int, *, measure: bool = True, clock: Callable[[], float] = time.perf_counter
) -> Device:
    """Device `index`: name, memory, bandwidth (each None where its call failed)."""
    try:
        _call(lib, "cudaSetDevice", index)
    except CudaError as exc:
        return Device(index, f"device {index}", None, None, None, None, str(exc))
    name = _name(lib, index)
    free, total = _memory(lib)
    spec = spec_bandwidth(
        _attribute(lib, ATTR_MEMORY_CLOCK_KHZ, index), _attribute(lib, ATTR_BUS_WIDTH_BITS, index)
    )
    if not measure:
        return Device(index, name, free, total, spec)
    try:
        copied = copy_bandwidth(lib, free, clock=clock)
    except CudaError as exc:
        return Device(index, name, free, total, spec, None, str(exc))
    gb_s, problem = checked_copy(copied, spec)
    return Device(index, name, free, total, spec, gb_s, problem)


def _name(lib: Any, index: int) -> str:
    """The device's name, as printable text ("device N" where it cannot be read)."""
    props = ctypes.create_string_buffer(PROPS_BYTES)
    for call in ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"):
        if getattr(lib, call, None) is None:
            continue
        try:
            _call(lib, call, props, index)
        except CudaError:
            continue
        raw = props.raw[:256].split(b"\0", 1)[0].decode("utf-8", "replace")
        return _printable(raw).strip() or f"device {index}"
    return f"device {index}"


def _printable(text: str) -> str:
    """A string from the driver, shown and never obeyed: printable characters only."""
    return "".join(ch for ch in text if ch.isprintable())[:120]


def _memory(lib: Any) -> tuple[int | None, int | None]:
    """(free, total) bytes on the current device; (None, None) where not believable."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    try:
        _call(lib, "cudaMemGetInfo", ctypes.pointer(free), ctypes.pointer(total))
    except CudaError:
        return None, None
    if not 0 <= free.value <= total.value <= MOST_BYTES or total.value == 0:
        return None, None
    return free.value, total.value


def _attribute(lib: Any, attribute: int, index: int) -> int | None:
    value = ctypes.c_int(0)
    try:
        _call(lib, "cudaDeviceGetAttribute", ctypes.pointer(value), attribute, index)
    except CudaError:
        return None
    return value.value


def spec_bandwidth(clock_khz: int | None, bus_bits: int | None) -> float | None:
    """The memory's specified bandwidth in GB/s: 2 (double data rate) x clock x bus
    width in bytes; None when either is missing or the product is not believable."""
    if not clock_khz or not bus_bits or clock_khz <= 0 or bus_bits <= 0:
        return None
    gb_s = 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    return gb_s if LOWEST_GB_S <= gb_s <= HIGHEST_GB_S else None


def copy_bandwidth(
    lib: Any,
    free: int | None,
    size: int = COPY_BYTES,
    rounds: int = ROUNDS,
    copies: int = COPIES,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """GB/s of the fastest round of `copies` device-to-device copies of `size` bytes on
    the current device (each reads and writes `size`). Raises CudaError: a failed call,
    or too little free memory for two buffers and room to spare."""
    if free is not None and free < 4 * size:
        raise CudaError(f"{free / 2**20:,.0f} MiB free: too little for a {size >> 20} MiB copy")
    src, dst = ctypes.c_void_p(), ctypes.c_void_p()
    try:
        _call(lib, "cudaMalloc", ctypes.pointer(src), size)
        _call(lib, "cudaMalloc", ctypes.pointer(dst), size)
        _call(lib, "cudaMemset", src, 0x5A, size)  # real pages before the timing
        _call(lib, "cudaMemcpy", dst, src, size, MEMCPY_DEVICE_TO_DEVICE)
        _call(lib, "cudaDeviceSynchronize")
        best = math.inf
        for _ in range(rounds):
            t0 = clock()
            for _ in range(copies):
                _call(lib, "cudaMemcpy", dst, src, size, MEMCPY_DEVICE_TO_DEVICE)
            # a copy between device buffers returns before it is done: wait for all
            _call(lib, "cudaDeviceSynchronize")
            best = min(best, clock() - t0)
    finally:
        for buffer in (src, dst):
            if buffer.value:
                lib.cudaFree(buffer)
    if not best > 0:
        raise CudaError("the copies took no measurable time")
    return 2 * size * copies / best / 1e9


def checked_copy(gb_s: float, spec: float | None) -> tuple[float | None, str]:
    """A measured copy's GB/s if believable, else None and why."""
    if not LOWEST_GB_S <= gb_s <= HIGHEST_GB_S:  # NaN fails too
        return None, f"a copy measured {gb_s:,.1f} GB/s, not a GPU's memory"
    if spec is not None and gb_s > spec * BEYOND_SPEC:
        return None, f"a copy measured {gb_s:,.0f} GB/s, beyond the specified {spec:,.0f}"
    return gb_s, ""
