"""Bad input and a starved machine, through `phasechat ask` and the local backend.

Each case runs the real command in a subprocess, as a user would, and checks what the
user sees (exit code, one line on stderr, no traceback) and what is kept (the chat in the
database). A 1 MB prompt, blank prompts, an n_ctx beyond what the model was trained
for, and an address-space limit (RLIMIT_AS) too small for llama.cpp's allocations.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from phasechat.backends.events import GenerationRequest, Message, StreamError
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.gguf import geometry
from phasechat.chat.store.database import default_path
from tests.conftest import ROOT
from tests.helpers import stored_messages

#: A realistic 1 MB paste: a log file, many short lines.
LINE = "The quick brown fox jumps over the lazy dog; log line %06d.\n"


def megabyte_paste() -> str:
    """Exactly 1,000,000 characters of log lines."""
    text = "".join(LINE % i for i in range(1_000_000 // len(LINE % 0) + 1))
    return text[:1_000_000]


def ask(
    *args: str, stdin: str | None = None, limit_as: int | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m phasechat ask ARGS` in a subprocess (XDG dirs are the test's own).

    With `limit_as`, the child's address space is capped at that many bytes (and core
    dumps are off) before it starts.
    """

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    return subprocess.run(
        [sys.executable, "-m", "phasechat", "ask", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        preexec_fn=cap,
    )


def only_line(stderr: str) -> str:
    """The single line a failure prints, after checking it is one line and no traceback."""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("phasechat: ")
    return lines[0]


# -- 1. a prompt far larger than the context ----------------------------------------------


@pytest.mark.model
def test_1mb_prompt_on_stdin_fails_in_one_line_and_is_saved_whole() -> None:
    paste = megabyte_paste()
    r = ask("--n-ctx", "512", "--max-tokens", "8", "-", stdin=paste)
    assert r.returncode == 1
    line = only_line(r.stderr)
    assert "the context holds 512" in line  # no silent truncation: the sizes are named
    assert "Trim the history" in line and "--n-ctx" in line  # and the ways out
    assert r.stdout == ""  # no answer text was invented
    user, answer = stored_messages()
    assert user["role"] == "user" and user["content"] == paste  # kept whole
    assert answer["status"] == "error" and answer["error"] == line.removeprefix("phasechat: ")


# -- 2. blank prompts --------------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "stdin"), [("", None), ("   ", None), ("-", " \n\t\n")])
def test_blank_prompt_is_refused_and_nothing_saved(prompt: str, stdin: str | None) -> None:
    r = ask(prompt, stdin=stdin)
    assert r.returncode == 2 and r.stdout == ""
    assert only_line(r.stderr) == "phasechat: empty prompt: nothing to ask"
    assert not default_path().exists()  # no empty chat was created


# -- 3. the model cannot be loaded as asked ---------------------------------------------


@pytest.mark.model
async def test_n_ctx_beyond_training_names_the_trained_context(model_path: Path) -> None:
    trained = geometry(model_path).n_ctx_train
    assert trained > 0
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=trained * 4, warmup=False))
    await backend.start()
    assert backend.state == "failed"
    detail = backend.state_detail
    assert f"trained context ({trained} tokens)" in detail
    assert f"--n-ctx {trained} or less" in detail
    (event,) = [e async for e in backend.stream(GenerationRequest((Message("user", "hi"),)))]
    assert isinstance(event, StreamError) and event.kind == "model" and detail in event.message
    await backend.aclose()
    r = ask("--no-save", "--n-ctx", str(trained * 4), "hi")
    assert r.returncode == 2 and r.stdout == ""
    assert only_line(r.stderr) == f"phasechat: {detail}"


@pytest.mark.model
async def test_a_prompt_past_a_small_window_says_its_token_count(model_path: Path) -> None:
    """Issue 47, item 7: llama.cpp pads n_ctx 16 up to 256, llama-cpp-python's record of
    the cache is 16 long; a 32-token prompt was "generation failed: could not broadcast
    input array from shape (5,) into shape (0,)"."""
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=16, warmup=False))
    await backend.start()
    try:
        assert backend.state == "ready" and backend.context_window == 16
        messages = (Message("user", "hi"),)
        tokens = backend.count_tokens(messages).tokens
        assert tokens > 16
        (event,) = [e async for e in backend.stream(GenerationRequest(messages))]
    finally:
        await backend.aclose()
    assert isinstance(event, StreamError) and event.kind == "context_overflow"
    said = f"the prompt is {tokens:,} tokens; the context holds 16"
    assert said in event.message
    r = ask("--no-save", "--n-ctx", "16", "hi")  # with `ask`'s system prompt: fewer tokens
    assert r.returncode != 0
    assert re.fullmatch(
        r"phasechat: the prompt is \d\d tokens; the context holds 16\. Trim the history or "
        r"raise --n-ctx\.",
        only_line(r.stderr),
    )


def _vm_peak(code: str) -> int:
    """Peak address space (bytes) of a child that runs `code` (imports, mostly)."""
    probe = "; ".join(
        [code, "print([ln for ln in open('/proc/self/status') if ln.startswith('VmPeak')][0])"]
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    return int(out.split()[1]) * 1024


@pytest.mark.model
def test_too_little_memory_to_load_is_one_line(model_path: Path) -> None:
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("a GPU build maps device memory into the address space: RLIMIT_AS is moot")
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to measure the address space")
    n_ctx = 8192
    # Room for Python and every import, and the model's weights, but only half of the KV
    # cache that n_ctx needs: the failure lands inside llama.cpp's allocations.
    baseline = _vm_peak("import llama_cpp, numpy, phasechat.cli.main, backends.local")
    kv = geometry(model_path).kv_bytes(n_ctx, n_ctx)
    limit = baseline + model_path.stat().st_size + kv // 2
    r = ask("--no-save", "--threads", "1", "--n-ctx", str(n_ctx), "hi", limit_as=limit)
    assert r.returncode == 2, (limit, r.stderr)  # not a signal: no abort, no core dump
    line = only_line(r.stderr)
    assert "not enough memory" in line, line
    assert r.stdout == ""
