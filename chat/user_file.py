"""A file the user names on the command line (a bench script, a compare side's
`system=@FILE`), read whole within a size limit.

Only a regular file is read: a FIFO would block until a writer came (for ever), and a
device such as /dev/zero never ends. The file is opened without blocking and checked
on the descriptor itself, so what is read is what was checked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: opened this way, a FIFO with no writer does not block the open
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
_CHUNK = 1 << 20


def read_user_file(path: Path, limit: int) -> bytes:
    """The bytes of `path`. Raises OSError whose text is the reason in a few words
    (the caller names the file) for a file that cannot be opened, is not a regular
    file, or holds more than `limit` bytes."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        raise OSError(exc.strerror or str(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(f"larger than {limit:,} bytes")
    return b"".join(chunks)
