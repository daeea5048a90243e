"""Issue 49: how the engine process's end is told, without the model: a child that
writes three lines to its stderr and exits before it loads anything (a `sitecustomize`
put on its path: the real `python -m phasechat.backends.local.engine_process` starts, and
ends as a crash in llama.cpp's loader would, with its own words last)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import GenerationRequest, Message, ModelLoading, StreamError
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.engine_process import EngineProcess

#: waits for the parent's first message on the socket it was given (its last argument),
#: so that the end is read as a crash and not as a process that never started
DYING = """\
import os, socket, sys
socket.socket(fileno=int(sys.argv[-1])).recv(1)
sys.stderr.write("first: the loader starts\\nsecond: a middle line\\n\\nthe last words\\n\\n")
sys.stderr.flush()
os._exit(3)
"""


async def test_a_crash_is_told_by_its_exit_and_its_last_stderr_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sitecustomize.py").write_text(DYING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    backend = EngineProcess(LocalConfig(model_path=model))
    try:
        await backend.start()
        assert backend.state == "failed"
        assert backend.state_detail == (
            "the engine process ended (exit status 3: the last words): "
            "send again to load the model again"
        )
        # the next answer starts it again (a load, its own phase) and ends the same way
        request = GenerationRequest((Message("user", "Hi"),), max_tokens=2)
        events = [e async for e in backend.stream(request)]
        assert isinstance(events[0], ModelLoading)
        assert isinstance(events[-1], StreamError)
        assert "exit status 3: the last words" in events[-1].message
    finally:
        await backend.aclose()
