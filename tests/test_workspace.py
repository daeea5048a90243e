"""One application state for `ask`, `bench` and the UI: the same config means the same
thing in each (profiles, `[engine]`, `[trim]`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasechat.chat.config.file import Config, load_config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings, TrimConfig
from phasechat.chat.workspace import Workspace
from phasechat.cli.commands.options import build_workspace
from phasechat.cli.main import build_parser, main
from tests.scripted import ScriptedBackend

TINY = """
[engine]
temperature = 0.0
max_tokens = 6

[trim]
budget = 64
keep_last = 0

[[local]]
name = "tiny"
path = "smollm2"
n_ctx = 512
"""


def _config(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_every_command_builds_the_same_workspace_from_the_config(tmp_path: Path) -> None:
    config = _config(tmp_path)
    for argv in (
        ["--config", str(config), "--backend", "tiny"],
        ["ask", "--config", str(config), "--backend", "tiny", "hello"],
        ["bench", "--config", str(config), "--backend", "tiny", "script.json"],
    ):
        ws = build_workspace(build_parser().parse_args(argv))
        assert ws.backend.name == "tiny" and ws.backend.context_window == 512
        assert ws.turns.settings == Settings(temperature=0.0, max_tokens=6)
        trimmer = ws.turns.trimmer
        assert (trimmer.enabled, trimmer.budget, trimmer.keep_last) == (True, 64, 0)


def test_options_override_the_config_and_the_trim_section_names_a_summarizer(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, TINY.replace("keep_last = 0", 'keep_last = 0\nsummarizer = "tiny"'))
    args = build_parser().parse_args(["--config", str(config), "--max-tokens", "9"])
    ws = build_workspace(args)
    assert ws.backend.name == "local" and ws.turns.settings.max_tokens == 9
    # the summarizer is the "tiny" profile's own backend, built once and shared
    assert ws.turns.trimmer.summarizer is ws.built("tiny") is not None


async def test_switching_keeps_one_backend_per_profile_and_closes_only_its_own() -> None:
    handed = ScriptedBackend("a")
    other = BackendSpec("openai")
    ws = Workspace(Config(), BackendSpec("local", local_name="a"), [other], backend=handed)
    assert ws.switch("a") is None  # already active
    assert ws.switch("nope") is None  # unknown: nothing changes
    remote = ws.switch("openai")
    assert remote is not None and ws.backend is remote and ws.turns.backend is remote
    assert ws.switch("a") is handed and ws.switch("openai") is remote  # built once
    await ws.aclose()
    assert not handed.closed  # handed in: closed by its owner, not by the workspace


def test_settings_are_applied_and_saved_keeping_the_file(tmp_path: Path) -> None:
    path = _config(tmp_path, "# my own notes\n" + TINY)
    ws = Workspace(load_config(path), BackendSpec(), backend=ScriptedBackend("local"))
    summarizer, error = ws.apply_settings(
        Settings(system="Be terse.", max_tokens=7), TrimConfig(enabled=False, keep_last=2)
    )
    assert error is None and summarizer is None
    assert ws.turns.settings.system == ws.turns.conversation.system == "Be terse."
    assert not ws.turns.trimmer.enabled and ws.turns.trimmer.keep_last == 2
    saved = load_config(path)
    assert saved.engine.max_tokens == 7 and saved.trim == TrimConfig(enabled=False, keep_last=2)
    assert path.read_text().startswith("# my own notes\n")


@pytest.mark.model
def test_bench_runs_a_config_profile_with_the_configs_trim_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    script = tmp_path / "script.json"
    turns = ["Name a colour.", "Name a fruit.", "Name a tree.", "Name a bird."]
    script.write_text(json.dumps({"system": "Be brief.", "turns": turns}))
    argv = ["bench", "--config", str(config), "--backend", "tiny", "--json", str(script)]
    assert main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    total = lines[-1]
    assert total["turns"] == 4 and total["errors"] == 0
    # budget 64 with keep_last 0: the config's [trim] makes the replay summarize
    assert total["summaries"] >= 1
    assert main([*argv[:-1], "--no-trim", str(script)]) == 0
    untrimmed = [json.loads(x) for x in capsys.readouterr().out.splitlines()][-1]
    assert untrimmed["summaries"] == 0 and untrimmed["trims"] == 0
