"""A child process's stderr kept bounded: drained by a thread into its last
`STDERR_TAIL` bytes, for the one line a crash message quotes. A child that writes
without end costs a little CPU, never the disk or the memory (an unlinked temporary
file once held 4.6 GB in 10 s, unseen)."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any

#: the bytes of the child's stderr kept (its tail)
STDERR_TAIL = 8192


class StderrTail:
    """The child's stderr, drained by a thread into its last `STDERR_TAIL` bytes: a
    child that writes without end costs a little CPU, never the disk or the memory."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._tail = b""
        self._thread: threading.Thread | None = None
        if proc.stderr is not None:
            self._thread = threading.Thread(
                target=self._drain, args=(proc.stderr,), name="engine-stderr", daemon=True
            )
            self._thread.start()

    def _drain(self, pipe: Any) -> None:
        fd = pipe.fileno()
        try:
            while chunk := os.read(fd, 1 << 16):
                self._tail = (self._tail + chunk)[-STDERR_TAIL:]
        except OSError:
            pass
        finally:
            pipe.close()

    def last_line(self) -> str:
        """The last non-empty line written (at most 200 chars), once the pipe is read
        to its end (a moment at most: the child has ended)."""
        if self._thread is not None:
            self._thread.join(0.5)
        text = self._tail.decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""

    @property
    def size(self) -> int:
        """Bytes held (at most `STDERR_TAIL`)."""
        return len(self._tail)
