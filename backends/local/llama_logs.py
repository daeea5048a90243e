"""llama.cpp's own log lines: off stderr unless asked for (`--verbose`).

llama-cpp-python installs a log callback when imported that prints every line of
llama.cpp and ggml to stderr until a `Llama(verbose=False)` raises its threshold, and
ggml's CUDA backend logs its devices ("ggml_cuda_init: found 1 CUDA devices") the first
time anything touches the backend registry (`llama_supports_gpu_offload`, the system
info): on `--version`, `doctor` and every load. So every place that touches llama.cpp
first calls `quiet_llama()`, which installs a callback that drops the lines, unless the
command line asked for them (`set_verbose`), in which case llama-cpp-python's own
prints them all.
"""

from __future__ import annotations

import ctypes
import logging
from types import ModuleType
from typing import Any

#: the one writer is the command line (`--verbose`); read by `quiet_llama()` and the loads
_STATE: dict[str, Any] = {"verbose": False, "installed": None}


def set_verbose(on: bool) -> None:
    """Show llama.cpp's log lines on stderr (`--verbose`), or keep them off (default)."""
    _STATE["verbose"] = on
    if _STATE["installed"] is not None:  # llama.cpp already touched: switch now
        _STATE["installed"] = None
        quiet_llama()


def verbose() -> bool:
    """Whether llama.cpp's log lines go to stderr (for `Llama(verbose=...)`)."""
    return bool(_STATE["verbose"])


def quiet_llama() -> None:
    """Import llama_cpp and drop its log lines (or show them all, `--verbose`): call
    before anything that can make llama.cpp log."""
    import llama_cpp

    want = "shown" if _STATE["verbose"] else "dropped"
    if _STATE["installed"] != want:
        if want == "shown":
            from llama_cpp import _logger

            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
            logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG)
        else:
            llama_cpp.llama_log_set(_drop(llama_cpp), ctypes.c_void_p(0))
        _STATE["installed"] = want


_CALLBACK: list[Any] = []  # kept alive: llama.cpp holds a pointer to it


def _drop(llama_cpp: ModuleType) -> Any:
    """The callback that drops every line (made once)."""
    if not _CALLBACK:

        def drop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            return None

        _CALLBACK.append(llama_cpp.llama_log_callback(drop))
    return _CALLBACK[0]
