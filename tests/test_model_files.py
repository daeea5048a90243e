"""Issue 47, items 3, 6 and 11: a model path that is not a GGUF llama.cpp can be given
(a FIFO, a header that claims more than the file holds, a vocabulary with a token
twice, a file cut off) is named in one line before anything loads it, on every way in:
`--model`, `ask --dry-run`, compare's `model=` and `draft=`, the TUI's command line, a
config's model; never a process blocked for ever, an abort, or a damaged file blamed on
memory."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from phasechat.backends.local.gguf import GGUFError, check_model
from tests.test_cli import phasechat

#: what a FIFO used to do: block for ever (a generous bound proves it does not)
NOT_HUNG_S = 60


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    os.mkfifo(path)
    return path


def huge_string(path: Path) -> Path:
    """35 bytes: a GGUF v3 header with one key whose string claims 2^60 bytes."""
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**60) + b"key"
    assert len(data) == 35
    path.write_bytes(data)
    return path


def twice_in_vocabulary(source: Path, path: Path) -> Path:
    """A copy of `source` whose vocabulary has one token's text twice (another token of
    the same length overwritten in place): llama.cpp's GGML_ASSERT(id_to_token.size()
    == token_to_id.size()) aborts the process on it."""
    import gguf

    shutil.copy(source, path)
    reader = gguf.GGUFReader(str(path), "r+")
    tokens = reader.fields["tokenizer.ggml.tokens"]
    parts = [tokens.parts[i] for i in tokens.data]
    i = next(i for i in range(1000, len(parts) - 1) if len(parts[i]) == len(parts[i + 1]))
    parts[i + 1][:] = parts[i]
    reader.data.flush()
    del reader
    return path


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_each_bad_file_is_named_in_one_line(tmp_path: Path, fifo: Path, model_path: Path) -> None:
    whole = model_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:-100])
    cases = {
        fifo: "model path is not a regular file (a FIFO)",
        Path("/dev/zero"): "model path is not a regular file (a device)",
        tmp_path: "model path is a directory",
        huge_string(tmp_path / "huge.gguf"): "model file is damaged (a string of "
        "1,152,921,504,606,846,976 bytes with 3 left in the file)",
        twice_in_vocabulary(model_path, tmp_path / "twice.gguf"): "is in its vocabulary twice",
        cut: f"model file is truncated: its tensors need {len(whole):,} bytes, "
        f"it has {len(whole) - 100:,}",
    }
    for path, why in cases.items():
        with pytest.raises(GGUFError) as caught:
            check_model(path)
        message = str(caught.value)
        assert why in message and str(path) in message
        assert "memory" not in message and "\n" not in message
    check_model(model_path)  # the bundled model passes


@pytest.mark.parametrize(
    "args",
    [
        ("ask", "--model", "{fifo}", "hi"),
        ("ask", "--dry-run", "--model", "{fifo}", "hi"),
        ("compare", "--backend", "local", "--backend", "local:model={fifo}", "hi"),
        ("compare", "--backend", "local", "--backend", "local:draft={fifo}", "hi"),
        ("--model", "{fifo}"),  # the TUI: refused before it draws
    ],
)
def test_a_fifo_as_the_model_is_one_line_not_a_hang(fifo: Path, args: tuple[str, ...]) -> None:
    r = phasechat(*(a.format(fifo=fifo) for a in args), timeout=NOT_HUNG_S)
    assert r.returncode == 2
    assert one_line(r.stderr).endswith(f"model path is not a regular file (a FIFO): {fifo}")


def test_a_config_model_that_is_a_fifo_is_one_line(tmp_path: Path, fifo: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[[local]]\nname = "mine"\npath = "{fifo}"\n')
    r = phasechat("--config", str(config), "ask", "--backend", "mine", "hi", timeout=NOT_HUNG_S)
    assert r.returncode == 2
    assert one_line(r.stderr).endswith(f"model path is not a regular file (a FIFO): {fifo}")


def test_a_damaged_vocabulary_is_one_line_not_an_abort(tmp_path: Path, model_path: Path) -> None:
    twice = twice_in_vocabulary(model_path, tmp_path / "twice.gguf")
    for args in (
        ("ask", "--model", str(twice), "hi"),
        ("compare", "--backend", "local", "--backend", f"local:model={twice}", "hi"),
    ):
        r = phasechat(*args)
        assert r.returncode == 2, r  # not 134 (SIGABRT)
        line = one_line(r.stderr)
        assert "is in its vocabulary twice" in line and str(twice) in line


def test_a_header_claiming_more_than_the_file_is_damaged_not_memory(tmp_path: Path) -> None:
    r = phasechat("ask", "--model", str(huge_string(tmp_path / "huge.gguf")), "hi")
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "model file is damaged" in line and "memory" not in line
