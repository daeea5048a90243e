"""The CUDA runtime through ctypes (backends/local/cuda.py), on a stand-in library that answers
the calls as the runtime documents them (no GPU here), its "no CUDA" path in this very
process, and llama.cpp's log lines kept off stderr (backends/local/llama_logs.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phasechat.backends.local import cuda
from phasechat.backends.local.cuda import (
    COPIES,
    COPY_BYTES,
    Device,
    Gpus,
    checked_copy,
    copy_bandwidth,
    read_gpus,
    runtime_path,
    spec_bandwidth,
)

GB = 1e9


class FakeCuda:
    """The calls backends/local/cuda.py makes, answered as cuda_runtime_api.h documents them:
    out-parameters through pointers, 0 for success, else an error number. Each device
    copies at `rate` (GB/s) on `clock`: a device-to-device copy is queued, and the time
    it takes passes at the next synchronisation."""

    def __init__(
        self, names: list[bytes], rate: float = 3600.0, fail: dict[str, int] | None = None
    ):
        self.names, self.rate, self.fail = names, rate, fail or {}
        self.now, self.queued, self.device = 0.0, 0, 0
        self.buffers: dict[int, int] = {}
        self.kinds: list[int] = []
        self.memory = (140 * 2**30, 141 * 2**30)

    def clock(self) -> float:
        return self.now

    def _rc(self, name: str) -> int:
        return self.fail.get(name, 0)

    def cudaGetDeviceCount(self, n: Any) -> int:
        n.contents.value = len(self.names)
        return self._rc("cudaGetDeviceCount")

    def cudaRuntimeGetVersion(self, v: Any) -> int:
        v.contents.value = 12040
        return 0

    def cudaSetDevice(self, index: int) -> int:
        self.device = index
        return self._rc("cudaSetDevice")

    def cudaGetDeviceProperties_v2(self, props: Any, index: int) -> int:
        ctypes.memmove(props, self.names[index] + b"\0", len(self.names[index]) + 1)
        return 0

    def cudaMemGetInfo(self, free: Any, total: Any) -> int:
        free.contents.value, total.contents.value = self.memory
        return 0

    def cudaDeviceGetAttribute(self, value: Any, attribute: int, index: int) -> int:
        value.contents.value = {36: 2_619_000, 37: 6144}[attribute]  # kHz, bits
        return 0

    def cudaMalloc(self, ptr: Any, size: int) -> int:
        if rc := self._rc("cudaMalloc") if self.buffers else 0:
            return rc  # the second allocation fails
        address = 0x1000 * (len(self.buffers) + 1)
        ptr.contents.value = address
        self.buffers[address] = size
        return 0

    def cudaFree(self, ptr: ctypes.c_void_p) -> int:
        del self.buffers[ptr.value or 0]
        return 0

    def cudaMemset(self, ptr: ctypes.c_void_p, value: int, size: int) -> int:
        return 0

    def cudaMemcpy(self, dst: Any, src: Any, size: int, kind: int) -> int:
        self.kinds.append(kind)
        self.queued += 2 * size  # read and written
        return 0

    def cudaDeviceSynchronize(self) -> int:
        self.now += self.queued / (self.rate * GB)
        self.queued = 0
        return 0

    def cudaGetErrorString(self, rc: int) -> bytes:
        return {2: b"out of memory"}.get(rc, b"unknown error")


def test_the_specified_bandwidth_is_double_data_rate_times_the_bus_in_bytes() -> None:
    # an H100 SXM: 2,619 MHz HBM3 on 5,120 bits: its datasheet's 3.35 TB/s
    assert spec_bandwidth(2_619_000, 5120) == pytest.approx(3352.32)
    # an RTX 4090: 10,501 MHz on 384 bits: 1,008 GB/s (without the x2: 504)
    assert spec_bandwidth(10_501_000, 384) == pytest.approx(1008.096)
    for clock, bus in ((0, 5120), (2_619_000, 0), (None, 5120), (-1, 5120), (1, 8)):
        assert spec_bandwidth(clock, bus) is None  # missing, or not a GPU's memory


def test_a_copy_s_bandwidth_counts_each_byte_read_and_written() -> None:
    lib = FakeCuda([b"NVIDIA H200"], rate=4000.0)
    gb_s = copy_bandwidth(lib, free=None, size=COPY_BYTES, rounds=3, copies=COPIES, clock=lib.clock)
    assert gb_s == pytest.approx(4000.0)  # 2 x size x copies / time; 2000 if counted once
    assert set(lib.kinds) == {cuda.MEMCPY_DEVICE_TO_DEVICE}
    assert len(lib.kinds) == 1 + 3 * COPIES  # one untimed first, then the rounds
    assert lib.buffers == {}  # both buffers freed


def test_a_device_is_named_with_its_memory_and_its_measured_bandwidth() -> None:
    lib = FakeCuda([b"NVIDIA H200", b"NVIDIA H100 80GB HBM3"], rate=3600.0)
    found = read_gpus(lib, "/opt/libcudart.so.12", clock=lib.clock)
    assert found is not None and found.version == "12.4"
    first, second = found.devices
    assert (first.name, second.name) == ("NVIDIA H200", "NVIDIA H100 80GB HBM3")
    assert (first.free_bytes, first.total_bytes) == (140 * 2**30, 141 * 2**30)
    assert first.spec_gb_s == pytest.approx(2 * 2.619e9 * 6144 / 8 / 1e9)  # 4,022.8
    assert first.copy_gb_s == pytest.approx(3600.0) and first.gb_s == first.copy_gb_s
    assert first.how == "NVIDIA H200, measured by a device-to-device copy"


def test_a_failed_allocation_leaves_the_specification_labelled_and_nothing_allocated() -> None:
    lib = FakeCuda([b"NVIDIA H200"], fail={"cudaMalloc": 2})
    found = read_gpus(lib, "libcudart.so.12", clock=lib.clock)
    assert found is not None
    (d,) = found.devices
    assert d.copy_gb_s is None and d.copy_problem == "cudaMalloc: CUDA error 2 (out of memory)"
    assert d.gb_s == d.spec_gb_s and d.how.endswith(
        "specification (memory clock x bus width), not measured"
    )
    assert lib.buffers == {}  # the first buffer was freed


@pytest.mark.parametrize(
    ("gb_s", "spec", "believed"),
    [
        (3600.0, 4022.8, 3600.0),
        (4200.0, 4022.8, 4200.0),  # within 5% of the specification: measured as is
        (4300.0, 4022.8, None),  # beyond it: the copies were not all timed
        (9e6, None, None),  # a copy that took no time
        (float("nan"), None, None),
        (2.0, None, None),  # not a GPU's memory
    ],
)
def test_a_copy_that_cannot_be_is_unknown(
    gb_s: float, spec: float | None, believed: float | None
) -> None:
    got, problem = checked_copy(gb_s, spec)
    assert got == believed and (problem == "") == (believed is not None)


def test_an_impossible_copy_falls_back_to_the_specification() -> None:
    lib = FakeCuda([b"NVIDIA H200"], rate=40_000.0)  # ten times its memory's own rate
    found = read_gpus(lib, "libcudart.so.12", clock=lib.clock)
    assert found is not None
    (d,) = found.devices
    assert d.copy_gb_s is None and "beyond the specified 4,023" in d.copy_problem
    assert d.gb_s == pytest.approx(4022.784)


def test_free_memory_above_the_total_is_unknown_and_a_hostile_name_is_shown_inert() -> None:
    lib = FakeCuda([b"NVIDIA\x1b[2J H200\n\x07"], rate=3600.0)
    lib.memory = (200 * 2**30, 141 * 2**30)
    found = read_gpus(lib, "libcudart.so.12", measure=False)
    assert found is not None
    (d,) = found.devices
    assert d.name == "NVIDIA[2J H200" and (d.free_bytes, d.total_bytes) == (None, None)
    assert d.copy_gb_s is None and d.copy_problem == ""  # not asked for


def test_a_runtime_that_cannot_count_its_devices_is_no_gpu() -> None:
    assert read_gpus(FakeCuda([b"x"], fail={"cudaGetDeviceCount": 100}), "libcudart.so") is None
    assert read_gpus(FakeCuda([]), "libcudart.so") is None  # no device


def test_the_fastest_device_is_the_ceiling() -> None:
    slow = Device(0, "A", None, None, 900.0)
    fast = Device(1, "B", None, None, 2000.0, 1800.0)
    unknown = Device(2, "C", None, None, None)
    assert Gpus("rt", "", (slow, fast, unknown)).fastest() is fast
    assert Gpus("rt", "", (unknown,)).fastest() is None


def write_maps(path: Path, *libraries: str) -> Path:
    lines = [
        f"7f00000{i}000-7f00000{i}fff r-xp 00000000 08:01 {i} {lib}"
        for i, lib in enumerate(libraries)
    ]
    path.write_text("\n".join(["7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]", *lines]) + "\n")
    return path


def test_the_runtime_is_the_one_the_loaded_cuda_backend_links(tmp_path: Path) -> None:
    lib_dir = "/site-packages/llama_cpp/lib"
    maps = write_maps(
        tmp_path / "maps",
        f"{lib_dir}/libggml-cuda.so",
        "/usr/local/cuda-12.4/lib64/libcudart.so.12.4.127",
        "/usr/lib/libc.so.6",
    )
    assert runtime_path(maps) == "/usr/local/cuda-12.4/lib64/libcudart.so.12.4.127"
    # the CUDA backend with its runtime linked in: the system's, if any
    linked_in = write_maps(tmp_path / "linked", f"{lib_dir}/libggml-cuda.so")
    assert runtime_path(linked_in) == ctypes.util.find_library("cudart")
    # a CPU build: no GPU, whatever the machine has installed
    cpu = write_maps(tmp_path / "cpu", f"{lib_dir}/libggml-cpu.so", f"{lib_dir}/libllama.so")
    assert runtime_path(cpu) is None
    assert runtime_path(tmp_path / "absent") is None
    # a runtime in the map that cannot be opened is no GPU either
    assert cuda.gpus(write_maps(tmp_path / "gone", "/nowhere/libcudart.so.12")) is None
    # nor a library by that name without the runtime's calls (here: this process's libc)
    libc = next(
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "/libc.so" in line
    )
    impostor = tmp_path / "libcudart.so.12"
    impostor.symlink_to(libc)
    assert cuda.load_runtime(write_maps(tmp_path / "impostor", str(impostor))) is None


@pytest.mark.model
def test_this_cpu_build_has_no_gpu_once_llama_cpp_is_loaded() -> None:
    import llama_cpp

    assert not llama_cpp.llama_supports_gpu_offload()
    assert runtime_path() is None and cuda.gpus() is None


LOAD = (
    "import sys; from phasechat.backends.local import llama_logs; "
    "from phasechat.backends.local.models import default_model_path; "
    "{setup}; import llama_cpp; "
    "llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=64, verbose=True)"
)


def _load_stderr(setup: str) -> str:
    """A model load that asks llama-cpp-python for its lines (verbose=True): the lines
    that reach stderr, after `setup`."""
    code = LOAD.format(setup=setup)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr


@pytest.mark.model
def test_llama_cpp_s_log_lines_are_dropped_unless_asked_for() -> None:
    # llama.cpp's own lines, from its loader, its model print-out and its context
    marks = ("llama_model_loader:", "print_info:", "llama_context:")
    loud = _load_stderr("pass")  # llama-cpp-python's own callback: every line
    assert all(mark in loud for mark in marks)
    quiet = _load_stderr("llama_logs.quiet_llama()")  # (its own Python prints remain)
    assert not any(mark in quiet for mark in marks)
    shown = _load_stderr("llama_logs.set_verbose(True); llama_logs.quiet_llama()")
    assert all(mark in shown for mark in marks)  # --verbose: every line again
