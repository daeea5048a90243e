"""Odd files and odd text: a config nested 100,000 deep, user themes of the wrong types,
a FIFO named *.toml, exports of cells a spreadsheet or a terminal would obey."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phasechat.chat.config.file import ConfigError, load_config
from phasechat.chat.config.paths import themes_dir
from phasechat.chat.text import visible_controls
from phasechat.telemetry.records import to_csv, to_jsonl
from phasechat.themes import load_user_themes


def test_config_nested_100000_deep_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("theme = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply") as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_config_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('name = "t"\nprimary = 1\n', "needs string keys"),
        ('name = "t"\nprimary = "#fff"\nsecondary = 7\n', "'secondary' must be a string"),
        ('name = "t"\nprimary = "#fff"\nvariables = "x"\n', "'variables' must be a table"),
        ('name = "t"\nprimary = "#fff"\n[variables]\nstall = 3\n', "variables.stall must be"),
        ('name = "t"\nprimary = "#fff"\ndark = "yes"\n', "'dark' must be true or false"),
        ('name = "t"\nprimary = "#fff"\n"[/]" = "x"\n', "unknown key '[/]'"),
        ('name = "t"\nprimary = ' + "[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ],
)
def test_user_themes_of_the_wrong_types_are_skipped_with_one_line(
    tmp_path: Path, text: str, error: str
) -> None:
    (tmp_path / "bad.toml").write_text(text)
    (tmp_path / "good.toml").write_text('name = "good"\nprimary = "#336699"\n')
    themes, errors = load_user_themes(tmp_path)
    assert [t.name for t in themes] == ["good"]
    assert len(errors) == 1 and error in errors[0] and "\n" not in errors[0]


def test_a_fifo_named_toml_does_not_hang_the_start(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.toml")
    themes, errors = load_user_themes(tmp_path)
    assert themes == [] and errors == ["theme pipe.toml skipped: not a regular file"]


def test_a_bad_theme_does_not_stop_the_app_from_starting(tmp_path: Path) -> None:
    """The whole start, in a subprocess, with a theme whose `variables` is not a table."""
    folder = themes_dir()
    folder.mkdir(parents=True)
    (folder / "bad.toml").write_text('name = "bad"\nprimary = "#fff"\nvariables = "x"\n')
    os.mkfifo(folder / "fifo.toml")
    (folder / "markup.toml").write_text('name = "m"\nprimary = "#fff"\n"[/]" = "x"\n')
    code = (
        "import asyncio\n"
        "from phasechat.tui.app import PhasechatApp\n"
        "from tests.scripted import ScriptedBackend\n"
        "async def main():\n"
        "    app = PhasechatApp(backend=ScriptedBackend())\n"
        "    async with app.run_test() as pilot:\n"
        "        await pilot.pause()\n"
        "        print('\\n'.join(n.message for n in app._notifications))\n"
        "asyncio.run(main())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "theme bad.toml skipped: 'variables' must be a table" in r.stdout
    assert "theme fifo.toml skipped: not a regular file" in r.stdout
    assert "theme markup.toml skipped: unknown key '[/]'" in r.stdout  # no MarkupError


def test_csv_cells_starting_with_tab_or_cr_are_neutralized_and_controls_shown() -> None:
    rows = [
        {"request": 1, "prompt": "\t=1+2"},
        {"request": 2, "prompt": "\r=HYPERLINK(1)"},
        {"request": 3, "prompt": "=SUM(A1)"},
        {"request": 4, "prompt": "red \x1b[31m c1 \x9b31m ok"},
    ]
    text = to_csv(rows)
    assert "\x1b" not in text and "\x9b" not in text
    prompts = [r["prompt"] for r in csv.DictReader(io.StringIO(text))]
    assert prompts[:3] == ["'\t=1+2", "'\r=HYPERLINK(1)", "'=SUM(A1)"]
    assert prompts[3] == "red \\x1b[31m c1 \\x9b31m ok"


def test_jsonl_escapes_esc_and_c1_and_keeps_the_text_exact() -> None:
    record = {"request": 1, "prompt": "a\x1b]52;c;eA==\x07 b\x9b31m c\x7f"}
    text = to_jsonl([record])
    assert not any(ch in text for ch in "\x1b\x07\x9b\x7f")
    assert json.loads(text) == record


def test_bidi_overrides_are_made_visible() -> None:
    shown = visible_controls("abc\u202edcba\u2066x\u2069")
    assert shown == "abc<U+202E>dcba<U+2066>x<U+2069>"
