"""A child's stderr kept to its tail (backends/stderr_tail.py), with real child
processes and no model: the line a crash message quotes, the bytes kept, the pipe
closed, and a grandchild that keeps the pipe open never holding the caller or the
interpreter's exit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from phasechat.backends.local.stderr_tail import STDERR_TAIL, StderrTail

#: a bound that only a hang reaches (nothing here takes a second when all is well)
NOT_HUNG_S = 30.0


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)


def ended(code: str) -> StderrTail:
    """The tail of a child that ran `code` and exited 0."""
    proc = child(code)
    tail = StderrTail(proc)
    assert proc.wait(timeout=NOT_HUNG_S) == 0
    tail.last_line()  # read to the pipe's end
    return tail


def test_the_last_line_is_the_last_one_written_not_a_blank_after_it() -> None:
    tail = ended(
        "import sys\nsys.stderr.write('loading\\nGGML_ASSERT(n_ctx > 0) failed\\n  \\n\\n\\t\\n')\n"
    )
    assert tail.last_line() == "GGML_ASSERT(n_ctx > 0) failed"


def test_the_last_line_is_stripped_of_the_spaces_around_it() -> None:
    tail = ended("import sys; sys.stderr.write('first\\n   died here \\t')\n")
    assert tail.last_line() == "died here"


def test_a_long_last_line_is_cut_to_200_characters() -> None:
    tail = ended("import sys; sys.stderr.write('a' * 150 + 'b' * 150 + '\\n')\n")
    assert tail.last_line() == "a" * 150 + "b" * 50


def test_a_silent_child_has_no_last_line_and_nothing_kept() -> None:
    tail = ended("pass")
    assert tail.last_line() == ""
    assert tail.size == 0


def test_a_child_without_a_stderr_pipe_has_no_last_line() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stderr=subprocess.DEVNULL)
    tail = StderrTail(proc)
    assert proc.wait(timeout=NOT_HUNG_S) == 0
    assert tail.last_line() == ""
    assert tail.size == 0


def test_more_than_the_tail_keeps_exactly_its_last_bytes() -> None:
    """100,000 numbered lines (far past one read of 64 KiB): the 8192 bytes kept are the
    last ones written, in order."""
    proc = child(
        "import sys\nfor i in range(100_000): sys.stderr.write(f'{i:09d}\\n')\n"
        "sys.stderr.write('the end')\n"
    )
    tail = StderrTail(proc)
    assert proc.wait(timeout=NOT_HUNG_S) == 0
    assert tail.last_line() == "the end"
    assert tail.size == STDERR_TAIL == 8192
    # 8192 bytes: "the end" (7) and 818 whole lines of 10, after 5 bytes of one before
    assert tail.size == 7 + 818 * 10 + 5


def test_a_tail_cut_inside_a_character_still_gives_the_last_line() -> None:
    """The cut at 8192 bytes lands inside a two-byte character: it is replaced, not
    raised, and the last line is whole."""
    tail = ended("import sys\nsys.stderr.write('é' * 10_001 + '\\nlast words: é\\n')\n")
    assert tail.last_line() == "last words: é"


def test_invalid_utf8_in_the_last_line_is_shown_replaced() -> None:
    tail = ended("import os; os.write(2, b'bad \\xff\\xfe bytes\\n')\n")
    assert tail.last_line() == "bad \ufffd\ufffd bytes"


def test_the_pipe_is_closed_once_read_to_its_end() -> None:
    """No descriptor is left open per engine started (a reload after each crash)."""
    proc = child("import sys; sys.stderr.write('x\\n')")
    tail = StderrTail(proc)
    assert proc.wait(timeout=NOT_HUNG_S) == 0
    assert tail.last_line() == "x"
    assert proc.stderr is not None and proc.stderr.closed


def test_the_reader_is_a_named_thread_while_the_child_runs() -> None:
    """`engine-stderr` in a thread dump (faulthandler, py-spy) says what it waits on."""
    proc = child("import sys, time; sys.stderr.write('up\\n'); sys.stderr.flush(); time.sleep(60)")
    try:
        tail = StderrTail(proc)
        deadline = time.monotonic() + NOT_HUNG_S
        while tail.size == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        names = [t.name for t in threading.enumerate() if t.daemon]
        assert "engine-stderr" in names
        assert proc.poll() is None  # still running: the thread was not already done
    finally:
        proc.kill()
        proc.wait()
    assert tail.last_line() == "up"


GRANDCHILD = (
    "import subprocess, sys\n"
    "sys.stderr.write('child: last words\\n'); sys.stderr.flush()\n"
    # a grandchild that inherits stderr and outlives the child: the pipe stays open
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
    "                     stdout=subprocess.DEVNULL)\n"
    "print(g.pid, flush=True)\n"
)


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_grandchild_holding_the_pipe_does_not_hold_the_last_line() -> None:
    """The child is gone but its grandchild keeps stderr open: the last line comes after
    the reader's short wait (half a second), not when the grandchild ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", GRANDCHILD], stderr=subprocess.PIPE, stdout=subprocess.PIPE
    )
    tail = StderrTail(proc)
    assert proc.stdout is not None
    out = proc.stdout.readline()
    proc.stdout.close()
    try:
        assert proc.wait(timeout=NOT_HUNG_S) == 0
        time.sleep(0.2)  # the line is read by now; what is left is the wait on an open pipe
        start = time.monotonic()
        assert tail.last_line() == "child: last words"
        waited = time.monotonic() - start
    finally:
        kill(int(out))
    # a wait of 0.5 s (a timed futex wait, not CPU-bound, so load barely moves it):
    # under 1.2 s tells it from a wait three times as long
    assert waited < 1.2, waited


def test_a_grandchild_holding_the_pipe_does_not_hold_the_interpreter_exit() -> None:
    """The reader is a daemon thread: a program that ends while a child's grandchild
    holds the pipe exits at once, not when the grandchild does (60 s)."""
    program = (
        "import subprocess, sys\n"
        "from phasechat.backends.local.stderr_tail import StderrTail\n"
        f"proc = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], "
        "stderr=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        "tail = StderrTail(proc)\n"
        "out = proc.stdout.readline()\n"
        "proc.wait()\n"
        "print(out.decode().strip(), tail.last_line(), sep='|', flush=True)\n"
    )
    started = subprocess.Popen(
        [sys.executable, "-c", program],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert started.stdout is not None
    pid, _, line = started.stdout.readline().strip().partition("|")
    try:
        assert line == "child: last words"
        assert started.wait(timeout=NOT_HUNG_S) == 0
    finally:
        started.kill()
        started.wait()
        kill(int(pid))
