"""Model output is data: markup and terminal control from a model are never interpreted.

The fault server's `markup` behaviour streams Rich/Textual markup (`[bold red]`,
`[@click=app.quit]`), ANSI colour, 8-bit CSI, OSC title / hyperlink / OSC 52 clipboard
sequences, BEL and NUL, as a hostile or confused model might.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.text import visible_controls
from phasechat.chat.turns import TurnController
from tests.conftest import ROOT
from tests.fault_server import MARKUP_PIECES, FaultServer, fault_server_thread

#: What must never reach a terminal: C0 controls but tab and newline, DEL, and C1.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")
#: The same, as bytes of UTF-8 output (C1 characters are encoded as C2 80..C2 9F).
CONTROL_BYTES = re.compile(b"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")
MARKUP = ("[bold red]not bold[/]", "[@click=app.quit]click[/]")


async def test_the_answer_keeps_the_data_and_visible_controls_defuses_it() -> None:
    async with FaultServer() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="markup"))
        turns = TurnController(backend, Settings(max_tokens=64))
        async for _ in turns.send("hi"):
            pass
        await backend.aclose()
    answer = turns.exchanges[-1].answer
    # The conversation keeps exactly what the model said: nothing dropped or rewritten.
    assert answer.status == "complete" and answer.content == "".join(MARKUP_PIECES)
    shown = visible_controls(answer.content)
    assert CONTROL.search(answer.content) and not CONTROL.search(shown)
    assert "␛]52;c;cHduZWQ=␇" in shown and "nul␀ end" in shown
    for markup in MARKUP:
        assert markup in shown  # text, verbatim: nothing here renders markup


def ask(base_url: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    """`phasechat ask` against `base_url`, as a user runs it; stdout and stderr as bytes."""
    command = [sys.executable, "-m", "phasechat", "ask", "--backend", "openai"]
    return subprocess.run(
        [*command, "--base-url", base_url, *extra, "hi"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )


def test_ask_prints_no_terminal_control() -> None:
    with fault_server_thread() as server:
        r = ask(server.base_url, "--model", "markup")
    assert r.returncode == 0, r.stderr
    assert CONTROL_BYTES.search(r.stdout) is None
    out = r.stdout.decode()
    for markup in MARKUP:
        assert markup in out
    assert "␛[31mred␛[0m" in out and "\\x9b31mc1red" in out  # shown, not obeyed


def test_ask_json_escapes_terminal_control() -> None:
    with fault_server_thread() as server:
        r = ask(server.base_url, "--model", "markup", "--json")
    assert r.returncode == 0, r.stderr
    assert CONTROL_BYTES.search(r.stdout) is None
    # Escaped, not lost: the JSON text is still exactly what the model said.
    assert json.loads(r.stdout)["text"] == "".join(MARKUP_PIECES)


def test_an_error_message_from_the_server_cannot_drive_the_terminal() -> None:
    with fault_server_thread() as server:
        r = ask(server.base_url, "--model", "errormid-markup")
    assert r.returncode == 1
    assert CONTROL_BYTES.search(r.stderr) is None and CONTROL_BYTES.search(r.stdout) is None
    assert "server error: crashed ␛]0;pwned␇ [bold]" in r.stderr.decode()
    assert r.stdout.decode().startswith("partial")  # the text before the error was printed
