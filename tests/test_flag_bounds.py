"""Flags and script files (issue 38, item 5): a flag gets the bounds the config file and
the F4 form apply (one source: chat/config/settings.py), each refused in one line with
nothing saved; a FIFO or a device named as a file is refused, not read (it would block,
or never end); a script nested 200,000 deep is one line; Ctrl+C during `ask` is one line
and the answer so far stays saved."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phasechat.chat.config.file import ConfigError, parse_config
from phasechat.chat.config.settings import Settings, load_problems, parse_settings, threads_max
from phasechat.chat.trips import replay
from phasechat.chat.trips.compare_targets import prompt_text
from phasechat.chat.user_file import read_user_file
from phasechat.cli.commands.options import check_flags
from phasechat.cli.main import main

TOO_MANY = str(threads_max() + 1)


def chats_db(home: Path) -> Path:
    return home / "data" / "phasechat" / "chats.db"


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--threads", "100000"], f"--threads 100000: expected 1 to {threads_max()} "),
        (["--threads", TOO_MANY], f"--threads {TOO_MANY}: expected 1 to {threads_max()} "),
        (["--threads", "0"], "--threads 0: expected 1 to"),
        (["--temperature", "nan"], "--temperature nan: expected 0 to 5"),
        (["--temperature", "-1"], "--temperature -1: expected 0 to 5"),
        (["--temperature", "1e308"], "--temperature 1e+308: expected 0 to 5"),
        (["--max-tokens", "0"], "--max-tokens 0: expected 1 to 16,777,216"),
        (["--max-tokens", "-5"], "--max-tokens -5: expected 1 to 16,777,216"),
        (["--n-ctx", "-5"], "--n-ctx -5: expected 16 to 16,777,216 tokens"),
        (["--gpu-layers", "-2"], "--gpu-layers -2: expected -1 (all) to 10,000"),
        (["--seed", "-1"], "--seed -1: expected 0 to 4,294,967,294"),
        (["--seed", str(2**64)], f"--seed {2**64}: expected 0 to 4,294,967,294"),
    ],
)
def test_a_flag_out_of_bounds_is_one_line_and_nothing_is_saved(
    flags: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ask", *flags, "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"phasechat: {line}") and err.count("\n") == 1, err
    assert not chats_db(tmp_path).exists()  # no chat, no "cancelled" answer


def test_the_bounds_edges_are_accepted() -> None:
    # the neighbours of the refused values: each at its bound passes
    edges = argparse.Namespace(
        threads=threads_max(), temperature=5.0, max_tokens=1, n_ctx=16, gpu_layers=-1
    )
    check_flags(edges)
    check_flags(argparse.Namespace(temperature=0.0, threads=1, context=16, seed=0))
    check_flags(argparse.Namespace(seed=2**32 - 2))
    with pytest.raises(ValueError, match="--seed 4294967295: expected 0 to"):
        check_flags(argparse.Namespace(seed=2**32 - 1))  # llama.cpp's "random"
    with pytest.raises(ValueError, match="--n-ctx 15: expected 16"):
        check_flags(argparse.Namespace(n_ctx=15))


def test_the_flag_the_config_and_the_form_share_one_bound() -> None:
    # the same problem text from the three places a value is given
    (threads,) = load_problems(threads=100_000)
    with pytest.raises(ValueError, match=r"^--threads 100000: ") as flag:
        check_flags(argparse.Namespace(threads=100_000))
    assert str(flag.value).endswith(threads[1])
    with pytest.raises(ConfigError) as config:
        parse_config('[[local]]\nname = "big"\nthreads = 100000\n', Path("c.toml"))
    assert str(config.value) == f"c.toml: local[0].threads: {threads[1]}"
    (temp,) = Settings(temperature=float("nan")).problems()
    with pytest.raises(ValueError, match=r"^temperature: ") as form:
        parse_settings(Settings(), "s", "nan", "512", "")
    assert str(form.value) == f"temperature: {temp[1]}"
    with pytest.raises(ConfigError, match=r"engine\.max_tokens: expected 1 to 16,777,216"):
        parse_config("[engine]\nmax_tokens = 0\n", Path("c.toml"))


def test_a_thread_count_past_the_cores_crashes_nothing_in_a_real_process(tmp_path: Path) -> None:
    # was SIGSEGV inside llama.cpp: now refused before the model loads
    r = subprocess.run(
        [sys.executable, "-m", "phasechat", "ask", "--threads", "100000", "hello"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("phasechat: --threads 100000: expected 1 to ")
    assert r.stderr.count("\n") == 1 and not chats_db(tmp_path).exists()


# -- files named on the command line --------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def phasechat(*args: str) -> subprocess.CompletedProcess[str]:
    # a timeout, so that a FIFO read again fails the test instead of hanging it
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_compare_with_system_from_a_fifo_is_refused_not_blocked(fifo: Path) -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        prompt_text("system", f"@{fifo}")
    r = phasechat("compare", "--backend", "local", "--backend", f"local:system=@{fifo}", "hi")
    assert r.returncode == 2
    assert r.stderr == f"phasechat: system=@{fifo}: not a regular file\n"


@pytest.mark.parametrize("name", ["fifo", "/dev/zero"])
def test_bench_of_a_fifo_or_a_device_is_one_line(name: str, fifo: Path) -> None:
    path = str(fifo) if name == "fifo" else name
    r = phasechat("bench", path)
    assert r.returncode == 2
    assert r.stderr == f"phasechat: cannot read {path}: not a regular file\n"


def test_a_file_is_read_up_to_its_limit_and_refused_past_it(tmp_path: Path) -> None:
    path = tmp_path / "ten"
    path.write_bytes(b"0123456789")
    assert read_user_file(path, 10) == b"0123456789"
    with pytest.raises(OSError, match="larger than 9 bytes"):
        read_user_file(path, 9)


def test_a_script_past_the_size_limit_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": ["a" * 100]}))
    monkeypatch.setattr(replay, "MAX_SCRIPT_BYTES", 64)
    with pytest.raises(ValueError, match=r"cannot read .*script.json: larger than 64 bytes"):
        replay.load_script(path)
    monkeypatch.setattr(replay, "MAX_SCRIPT_BYTES", 1024)
    assert replay.load_script(path).turns == ("a" * 100,)


def test_a_script_nested_200k_deep_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000)
    with pytest.raises(ValueError, match="not a script: JSON nested too deeply"):
        replay.load_script(path)
    r = phasechat("bench", str(path))
    assert r.returncode == 2
    assert r.stderr == f"phasechat: {path} is not a script: JSON nested too deeply\n"


def test_a_script_with_max_tokens_out_of_bounds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": ["hi"], "max_tokens": 10**30}))
    with pytest.raises(ValueError, match=r"'max_tokens' 10{30}: expected 1 to 16,777,216"):
        replay.load_script(path)


# -- Ctrl+C ---------------------------------------------------------------------------


@pytest.mark.model
def test_ctrl_c_during_ask_is_one_line_and_keeps_the_answer_so_far(tmp_path: Path) -> None:
    # Greedy, this prompt runs to --max-tokens (400 tokens, about 3.5 s here): the answer
    # cannot end before the Ctrl+C.
    ask = ["ask", "--max-tokens", "400", "--temperature", "0", "Tell a long story."]
    # A suite started in the background (`nohup scripts/test.sh &`: no job control) runs
    # with Ctrl+C ignored, and a child inherits that, as a background job should: the
    # child here gets it as a terminal's foreground job would.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "phasechat", *ask],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    said = b""
    deadline = time.monotonic() + 240  # the model loads first
    while len(said) < 8 and time.monotonic() < deadline and proc.poll() is None:
        said += proc.stdout.read() or b""
        time.sleep(0.05)
    assert len(said) >= 8, "no answer began"
    assert proc.poll() is None, "the answer ended before the Ctrl+C"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.decode() == "phasechat: interrupted\n"  # no traceback
    with sqlite3.connect(chats_db(tmp_path)) as db:
        rows = db.execute("SELECT status, content FROM messages WHERE role = 'assistant'")
        ((status, content),) = rows.fetchall()
    assert status == "cancelled"
    # what was printed before the signal is saved (not an empty "cancelled" answer)
    assert (said + out).decode().startswith(content) and len(content.encode()) >= 8


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--think-time", "nan"], "--think-time must be 0 to 3600 seconds"),
        (["--think-time", "-1"], "--think-time must be 0 to 3600 seconds"),
        (["--sweep", "1,2", "--slo-ttft-ms", "nan"], "--slo-ttft-ms must be positive"),
        (["--sweep", "1,2", "--slo-tpot-ms", "-3"], "--slo-tpot-ms must be positive"),
    ],
)
def test_bench_s_own_numbers_are_bounded_too(
    flags: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a NaN SLO was "met" by every answer (no comparison with NaN is true)
    script = tmp_path / "script.json"
    script.write_text('{"turns": ["hi"]}')
    args = [*flags] if "--sweep" in flags else [*flags, str(script)]
    assert main(["bench", *args]) == 2
    assert capsys.readouterr().err == f"phasechat: {line}\n"
