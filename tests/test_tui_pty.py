"""The real app under a real pseudo-terminal, against a hostile server: the bytes it
writes to the terminal hold no escape sequence the server sent, and markup in server
text does not crash it. The server (tests/fault_server.py, under /hostile/) lists one
model whose id sets the window title (OSC 0), writes the clipboard (OSC 52), holds
Textual markup (`[/]`) and a bidi override; asking it gives an error quoting the id."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.fault_server import fault_server_thread

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")


def read_for(fd: int, seconds: float, out: bytearray) -> bool:
    """Append what the app writes for `seconds`; False once it closed the terminal."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed its side
            return False
        if not data:
            return False
        out += data
    return True


def run_app(base_url: str, tmp_path: Path, keys: list[tuple[float, bytes]]) -> tuple[bytes, int]:
    """Start `phasechat` on a pty, type `keys` (after waiting the given seconds), quit
    with ctrl+q; returns every byte it wrote and its exit status."""
    env = {
        **os.environ,
        "PHASECHAT_FORCE_TUI": "1",
        "TERM": "xterm-256color",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "COLUMNS": "140",
        "LINES": "40",
    }
    argv = [sys.executable, "-m", "phasechat", "--backend", "openai", "--base-url", base_url]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the app, with the pty as its terminal
        os.execve(sys.executable, argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    out = bytearray()
    try:
        for wait, key in keys:
            read_for(fd, wait, out)
            if key:
                os.write(fd, key)
        read_for(fd, 3, out)
        os.write(fd, b"\x11")  # ctrl+q
        deadline = time.monotonic() + 30
        while read_for(fd, 1, out) and time.monotonic() < deadline:
            pass
    finally:
        status = reap(pid, 30)
        os.close(fd)
    return bytes(out), status


def reap(pid: int, seconds: float) -> int:
    """The child's exit code, killing it if it has not exited within `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, 9)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_server_escapes_and_markup_never_reach_the_terminal(tmp_path: Path) -> None:
    with fault_server_thread() as server:
        base = server.base_url.replace("/v1", "/hostile/v1")
        # Wait for the start (model listed), then send a prompt: the 400 quotes the id.
        out, code = run_app(base, tmp_path, [(8, b"hello"), (1, b"\r"), (6, b"")])
        assert server.requests, "the prompt never reached the server"
    assert b"\x1b]0;pwned" not in out  # the window title was not set
    assert b"\x1b]52;" not in out  # the clipboard was not written
    assert "\u202e".encode() not in out  # no bidi override reached the screen
    assert "␛]0;pwned".encode() in out  # the model id was drawn, made visible
    assert b"MarkupError" not in out and b"Traceback" not in out
    assert code == 0
