"""The TOML config: where it is found, round trips, one-line errors, inline keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.file import (
    Config,
    ConfigError,
    EndpointProfile,
    LocalProfile,
    config_path,
    load_config,
)
from phasechat.chat.config.settings import Settings
from phasechat.chat.config.write import dump_config, save_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_path_is_platform_config_dir_unless_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PHASECHAT_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "phasechat" / "config.toml"
    monkeypatch.setenv("PHASECHAT_CONFIG", str(tmp_path / "other.toml"))
    assert config_path() == tmp_path / "other.toml"


def test_missing_file_is_the_defaults_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none" / "config.toml"
    config = load_config(path)
    assert config == Config() and config.path == path
    assert config.engine == Settings()
    assert not path.parent.exists()


def test_importing_does_no_io(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PHASECHAT_CONFIG": ""}
    code = (
        "import phasechat.chat.config.file, phasechat.chat.store.database,"
        " phasechat.chat.store.export, phasechat.cli.main"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "cfg").exists()


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    config = Config(
        engine=Settings(
            system='Say "hi"\\ then\n\ttab \x1b[31m ünïcode',
            temperature=0.25,
            max_tokens=64,
            stop=("</s>", "\n\nUser:"),
            seed=42,
        ),
        endpoints=(
            EndpointProfile("lab", "http://127.0.0.1:8080/v1", "qwen", "LAB_KEY"),
            EndpointProfile("openai", "https://api.openai.com/v1"),
        ),
        local=(
            LocalProfile("tiny", "smollm2", n_ctx=1024, gpu_layers=-1, threads=2),
            LocalProfile("gemma", "/models/g.gguf", chat_format="gemma"),
        ),
        theme="phasechat-light",
    )
    path = save_config(config, tmp_path / "sub" / "config.toml")
    tomllib.loads(path.read_text())  # valid TOML for any reader, not only ours
    again = load_config(path)
    assert again == config and again.path == path and again.warnings == ()
    assert dump_config(again) == path.read_text()
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # no key: the usual mode


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_profiles_map_onto_backend_configs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
theme = "phasechat-dark"
[engine]
temperature = 1   # an integer is a fine float
max_tokens = 99
stop = ["###"]
[[endpoints]]
name = "lab"
base_url = "http://10.0.0.2:8000/v1"
api_key_env = "LAB_KEY"
[[local]]
name = "tiny"
path = "smollm2"
n_ctx = 2048
threads = 1
""",
    )
    config = load_config(path)
    assert config.engine == Settings(
        system=Settings().system, max_tokens=99, temperature=1.0, stop=("###",)
    )
    lab = config.endpoint("lab")
    assert lab is not None and config.endpoint("nope") is None
    assert lab.remote_config() == RemoteConfig(
        base_url="http://10.0.0.2:8000/v1", model=None, api_key_env="LAB_KEY", name="lab"
    )
    tiny = config.local_profile("tiny")
    assert tiny is not None
    assert tiny.local_config() == LocalConfig(
        model_path=default_model_path(), n_ctx=2048, gpu_layers=None, threads=1
    )
    assert config.theme == "phasechat-dark"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://a/v1"\n'
            '[[endpoints]]\nname = "b"\nbase_url = 42\n',
            "endpoints[1].base_url: expected a string, got 42",
        ),
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://a/v1"\napi_url = "x"\n',
            "endpoints[0].api_url: unknown key (expected one of: name, base_url, model, "
            "api_key_env, context, api_key)",
        ),
        ('[[local]]\nname = "x"\ngpu_layer = 3\n', "local[0].gpu_layer: unknown key"),
        ("[engine]\nmax_tokens = true\n", "engine.max_tokens: expected an integer, got true"),
        ("[engine]\ntemperature = -1\n", "engine.temperature: expected 0 to 5"),
        ('[engine]\nstop = ["a", 3]\n', "engine.stop[1]: expected a string, got 3"),
        ('[[local]]\npath = "smollm2"\n', "local[0].name: missing (required)"),
        (
            '[[local]]\nname = "x"\n[[local]]\nname = "x"\n',
            "local[1].name: duplicate name 'x'",
        ),
        ('[[endpoints]]\nname = "a"\nbase_url = "ftp://a"\n', "endpoints[0].base_url: expected"),
        ("colour = 3\n", "colour: unknown key"),
        ('endpoints = "x"\n', "endpoints: expected an array of tables"),
        ('[engine]\nsystem = "a"\nmax_tokens = = 3\n', "invalid TOML: Invalid value (at line 3"),
    ],
)
def test_invalid_config_is_one_line_naming_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = str(info.value)
    assert line.startswith(f"{path}: {message}"), line
    assert "\n" not in line


def test_inline_key_is_accepted_warned_about_and_kept_private(tmp_path: Path) -> None:
    secret = "sk-test-DO-NOT-LEAK-123"
    path = write(
        tmp_path,
        f'[[endpoints]]\nname = "lab"\nbase_url = "http://a/v1"\napi_key = "{secret}"\n',
    )
    path.chmod(0o644)
    config = load_config(path)
    (lab,) = config.endpoints
    assert lab.api_key == secret and config.has_inline_key
    assert secret not in repr(lab) and secret not in repr(config)
    assert secret not in " ".join(config.warnings)
    assert any("endpoints[0].api_key" in w for w in config.warnings)
    assert any("others can read it" in w for w in config.warnings)
    assert secret not in repr(lab.remote_config())  # the backend config never holds it

    saved = save_config(config)  # back where it came from
    assert saved == path and path.stat().st_mode & 0o777 == 0o600
    assert load_config(path).endpoints == config.endpoints
    assert not any("others can read it" in w for w in load_config(path).warnings)
    fresh = save_config(config, tmp_path / "new" / "config.toml")
    assert fresh.stat().st_mode & 0o777 == 0o600


def test_inline_key_is_installed_only_where_the_variable_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LAB_KEY", raising=False)
    EndpointProfile("lab", "http://a/v1", api_key_env="LAB_KEY", api_key="inline").install_key()
    assert os.environ["LAB_KEY"] == "inline"
    EndpointProfile("lab", "http://a/v1", api_key_env="LAB_KEY", api_key="other").install_key()
    assert os.environ["LAB_KEY"] == "inline"  # the environment wins


def run_phasechat(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine]\nmax_tokens = 'many'\n")
    r = run_phasechat("ask", "--config", str(path), "hi")
    assert r.returncode == 2
    assert r.stderr == f"phasechat: {path}: engine.max_tokens: expected an integer, got 'many'\n"
    r = run_phasechat("--config", str(path), "ask", "hi")  # before the subcommand, too
    assert r.returncode == 2 and "engine.max_tokens" in r.stderr


@pytest.mark.model
def test_cli_takes_engine_defaults_from_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "[engine]\nmax_tokens = 3\ntemperature = 0.0\n")
    monkeypatch.setenv("PHASECHAT_CONFIG", str(path))
    args = ("ask", "--json", "--no-save", "--n-ctx", "512", "Count to twenty.")
    out = json.loads(run_phasechat(*args).stdout)
    assert out["output_tokens"] == 3 and out["finish"] == "length"
    out = json.loads(run_phasechat(*args[:2], "--max-tokens", "5", *args[2:]).stdout)
    assert out["output_tokens"] == 5  # an option given beats the file
    assert "chat_id" not in out  # --no-save
