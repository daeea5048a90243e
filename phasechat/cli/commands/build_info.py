"""What this phasechat runs on: its own version and the llama.cpp build behind the local
backend, for `phasechat --version` and the first lines of `phasechat doctor`.

It reads the library, never a model: the cost is importing llama_cpp (a fraction of a
second, the shared libraries' load), so `--version` stays fast and prints nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from phasechat import __version__
from phasechat.backends.local.llama_logs import quiet_llama


@dataclass(frozen=True)
class LlamaBuild:
    version: str  # llama-cpp-python's
    library: str  # libllama's own version string, e.g. "0.5.0-dev"
    system_info: str  # the CPU features and backends it was compiled with
    gpu_offload: bool

    def lines(self) -> list[str]:
        """One fact per line, aligned as `doctor` prints them."""
        return [
            f"llama-cpp-python  {self.version} (libllama {self.library})",
            f"system info       {self.system_info}",
            f"GPU offload       {'yes' if self.gpu_offload else 'no (CPU-only build)'}",
        ]


def llama_build() -> LlamaBuild:
    """The installed llama-cpp-python's build. Raises ImportError when it will not load."""
    quiet_llama()  # its log lines off first: the GPU query below logs the devices
    import llama_cpp

    return LlamaBuild(
        version=llama_cpp.__version__,
        library=llama_cpp.llama_version().decode("utf-8", "replace"),
        system_info=llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
    )


def not_importable(exc: ImportError) -> str:
    return f"llama-cpp-python  not importable: {exc}"


def version_text() -> str:
    """`phasechat --version`: phasechat's version, then the llama.cpp build."""
    try:
        llama = llama_build().lines()
    except ImportError as exc:
        llama = [not_importable(exc)]
    return "\n".join([f"phasechat         {__version__}", *llama])
