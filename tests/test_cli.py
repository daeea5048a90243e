"""`phasechat ask`, `doctor` and `--version`, run as a user runs them: in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from tests.llama_server import free_port


def phasechat(
    *args: str, stdin: str | None = None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
    )


@pytest.mark.model
def test_ask_json_local_has_the_metric_set() -> None:
    r = phasechat(
        "ask", "--json", "--max-tokens", "16", "--temperature", "0", "--n-ctx", "1024", "Say hello."
    )
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.strip().splitlines()  # exactly one JSON object
    out = json.loads(line)
    for key in (
        "text",
        "backend",
        "model",
        "prompt_tokens",
        "output_tokens",
        "ttft_ms",
        "decode_tok_s",
        "e2e_ms",
    ):
        assert key in out
    assert out["backend"] == "local" and out["model"].endswith(".gguf")
    assert out["text"] and 1 <= out["output_tokens"] <= 16
    assert out["prompt_tokens_source"] == "tokenizer"
    assert 0 < out["ttft_ms"] <= out["e2e_ms"]
    assert len(out["token_times_ms"]) == out["output_tokens"]


@pytest.mark.model
def test_ask_streams_plain_text() -> None:
    r = phasechat("ask", "--max-tokens", "8", "--n-ctx", "1024", "Hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "{" not in r.stdout[:1]


def test_empty_prompt_is_refused_without_traceback() -> None:
    r = phasechat("ask", "   ")
    assert r.returncode == 2
    assert r.stderr.strip() == "phasechat: empty prompt: nothing to ask"


def test_missing_model_is_one_line() -> None:
    r = phasechat("ask", "--model", "/nonexistent/model.gguf", "hi")
    assert r.returncode == 2
    assert "model file not found" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unreachable_url_is_one_line() -> None:
    port = free_port()  # nothing listens there
    r = phasechat("ask", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "hi")
    assert r.returncode == 2
    assert "connection refused" in r.stderr and "Traceback" not in r.stderr


def test_doctor_reports_build_and_geometry() -> None:
    r = phasechat("doctor")
    assert r.returncode == 0, r.stderr
    assert "GPU offload" in r.stdout and "system info" in r.stdout
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in r.stdout
    assert "30" in r.stdout and "3 KV" in r.stdout  # 30 layers, 3 KV heads
    # which flash attention the local backend uses, and the measurement behind it
    assert re.search(r"flash attention (on|off) \((cached measurement|measured at load)", r.stdout)


def test_version_names_phasechat_and_the_llama_build_and_touches_nothing(tmp_path: Path) -> None:
    dirs = {var: tmp_path / var for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME")}
    r = subprocess.run(
        [sys.executable, "-m", "phasechat", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **{var: str(path) for var, path in dirs.items()}},
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no model load, no warning: the lines below and nothing else
    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    name, llama, info, offload = r.stdout.splitlines()
    assert name.split() == ["phasechat", pyproject["project"]["version"]]
    assert llama.split()[:2] == ["llama-cpp-python", metadata.version("llama-cpp-python")]
    assert "(libllama " in llama and info.startswith("system info") and "CPU" in info
    assert offload.startswith("GPU offload")
    # nothing measured or saved: no bandwidth probe, no flash-attention timing, no config
    assert not any(path.exists() for path in dirs.values())
