"""Command-line options shared by the TUI, `ask` and `bench`, and how they combine with
the config file into backend profiles and engine settings.

Precedence: an option given on the command line, then the config file, then built-in
defaults. Subcommands use `argparse.SUPPRESS` defaults so that an option given before
the subcommand (`phasechat --backend openai ask ...`) is not reset by the subcommand.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.gguf import check_model
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.file import Config, load_config
from phasechat.chat.config.profiles import BackendSpec, resolve_model_path
from phasechat.chat.config.settings import Settings, load_problems
from phasechat.chat.text import visible_controls
from phasechat.chat.workspace import Workspace

DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"


def add_backend_options(p: argparse.ArgumentParser, top: bool = True) -> None:
    """Backend and engine options; on a subcommand parser pass top=False."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    g = p.add_argument_group("backend")
    g.add_argument(
        "--backend",
        default=default("local"),
        help="local, openai, or the name of a profile in the config file",
    )
    g.add_argument(
        "--model",
        default=default(None),
        help="local: a GGUF path or a bundled alias (smollm2, gemma3); openai: the model name",
    )
    g.add_argument("--base-url", default=default(DEFAULT_BASE_URL), help="openai: endpoint")
    g.add_argument(
        "--api-key-env",
        default=default("OPENAI_API_KEY"),
        help="openai: the environment variable that holds the API key",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        default=default(False),
        help="openai: do not verify the server's TLS certificate (shown on every answer)",
    )
    g.add_argument(
        "--debug-http",
        action="store_true",
        default=default(False),
        help="log HTTP requests to stderr (credentials redacted)",
    )
    g.add_argument("--n-ctx", type=int, default=default(4096), help="local: context in tokens")
    g.add_argument(
        "--context",
        type=int,
        default=default(None),
        help="openai: the server's context window, for a server that does not report it",
    )
    g.add_argument(
        "--gpu-layers",
        type=int,
        default=default(None),
        help="local: layers to offload to the GPU (-1 all; default all if the build can)",
    )
    g.add_argument("--threads", type=int, default=default(None), help="local: physical cores")
    g.add_argument(
        "--verbose",
        action="store_true",
        default=default(False),
        help="local: show llama.cpp's own log lines on stderr (off by default)",
    )
    g.add_argument("--chat-format", default=default(None), help="local: override the template")
    e = p.add_argument_group("engine (defaults: the config file's [engine], else built in)")
    e.add_argument("--system", default=default(None), help="the system prompt")
    e.add_argument("--max-tokens", type=int, default=default(None))
    e.add_argument("--temperature", type=float, default=default(None))
    e.add_argument("--seed", type=int, default=default(None))
    p.add_argument(
        "--config",
        default=default(None),
        help="the config file (default: $PHASECHAT_CONFIG, else the user config directory)",
    )


def read_config(args: argparse.Namespace) -> Config:
    """The config `--config` names (else the default); warnings go to stderr.
    Raises ConfigError."""
    path = getattr(args, "config", None)
    config = load_config(Path(path).expanduser() if path else None)
    for warning in config.warnings:
        print(f"phasechat: warning: {visible_controls(warning)}", file=sys.stderr)
    if getattr(args, "debug_http", False):
        logger = logging.getLogger("phasechat.http")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(logging.StreamHandler(sys.stderr))
    return config


def backend_spec(args: argparse.Namespace, config: Config | None = None) -> BackendSpec:
    """The backend the options (and the config's profiles) describe.

    `--backend` is "local", "openai", or a config profile's name. Raises ModelNotFound,
    or ValueError for an unknown name.
    """
    config = config or Config()
    name = args.backend
    endpoint = config.endpoint(name)
    if endpoint is not None:
        endpoint.install_key()
        remote = endpoint.remote_config()
        return BackendSpec("remote", remote=_with_flags(remote, args))
    profile = config.local_profile(name)
    if profile is not None:
        return BackendSpec("local", local=_checked(profile.local_config()), local_name=name)
    if name == "local":
        local = LocalConfig(
            model_path=resolve_model_path(args.model),
            n_ctx=args.n_ctx,
            gpu_layers=args.gpu_layers,
            threads=args.threads,
            chat_format=args.chat_format,
        )
        return BackendSpec("local", local=_checked(local))
    if name == "openai":
        remote = RemoteConfig(
            base_url=args.base_url,
            model=args.model,
            api_key_env=args.api_key_env,
            context_window=args.context,
        )
        return BackendSpec("remote", remote=_with_flags(remote, args))
    known = [
        "local",
        "openai",
        *(e.name for e in config.endpoints),
        *(p.name for p in config.local),
    ]
    raise ValueError(f"unknown backend {name!r}: expected one of {', '.join(known)}")


def _checked(local: LocalConfig) -> LocalConfig:
    """`local`, once its model file is a GGUF llama.cpp can be given (a FIFO would block
    the load for ever, a damaged vocabulary abort the process). Raises GGUFError (a
    ValueError), one line."""
    if local.model_path is not None:
        check_model(local.model_path)
    return local


def _with_flags(remote: RemoteConfig, args: argparse.Namespace) -> RemoteConfig:
    """A profile's endpoint with the flags that apply to any endpoint."""
    if getattr(args, "insecure", False):
        remote = replace(remote, verify_tls=False)
    if getattr(args, "context", None):
        remote = replace(remote, context_window=args.context)
    return remote


def all_profiles(
    active: BackendSpec, args: argparse.Namespace, config: Config
) -> list[BackendSpec]:
    """Every backend the TUI can switch to: the active one, the config's profiles, and the
    other built-in kind (local <-> the --base-url endpoint)."""
    out = [active]
    for endpoint in config.endpoints:
        endpoint.install_key()
        out.append(BackendSpec("remote", remote=_with_flags(endpoint.remote_config(), args)))
    for profile in config.local:
        out.append(BackendSpec("local", local=profile.local_config(), local_name=profile.name))
    if active.kind == "local":
        remote = RemoteConfig(base_url=args.base_url, api_key_env=args.api_key_env)
        out.append(BackendSpec("remote", remote=_with_flags(remote, args)))
    else:
        out.append(BackendSpec("local", local=LocalConfig(n_ctx=args.n_ctx)))
    seen: set[str] = set()
    unique = []
    for spec in out:
        if spec.name not in seen:
            seen.add(spec.name)
            unique.append(spec)
    return unique


def settings_from(args: argparse.Namespace, config: Config | None = None) -> Settings:
    """Engine settings: the options given, else the config's [engine], else built in."""
    base = (config or Config()).engine
    given = {
        key: getattr(args, key)
        for key in ("system", "max_tokens", "temperature", "seed")
        if getattr(args, key, None) is not None
    }
    return replace(base, **given)


def check_flags(args: argparse.Namespace) -> None:
    """Refuse a flag out of the bounds the config file and the F4 form apply (one source:
    chat/config/settings.py), before anything is loaded, sent or saved: ValueError, one
    line naming the flag, e.g. `--threads 100000: expected 1 to 16 (…)`."""
    given = {
        key: getattr(args, key)
        for key in (
            "max_tokens", "temperature", "seed", "n_ctx", "gpu_layers", "threads", "context"
        )
        if getattr(args, key, None) is not None
    }  # fmt: skip
    engine = {k: v for k, v in given.items() if k in ("max_tokens", "temperature", "seed")}
    problems = replace(Settings(), **engine).problems() + load_problems(
        given.get("n_ctx"), given.get("gpu_layers"), given.get("threads"), given.get("context")
    )
    for key, problem in problems:
        value = given[key]
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise ValueError(f"--{key.replace('_', '-')} {shown}: {problem}")


def build_workspace(
    args: argparse.Namespace, *, all_backends: bool = True, own_process: bool = False
) -> Workspace:
    """The workspace the options and the config describe: what `ask`, `bench` and the
    UI all run on. `all_backends=False` leaves out the profiles one could switch to;
    `own_process` runs each local model in a process of its own (the UI's choice:
    backends/local/engine_process.py).

    Raises ConfigError, ModelNotFound, OSError or ValueError with a one-line message."""
    check_flags(args)
    config = read_config(args)
    spec = backend_spec(args, config)
    profiles = all_profiles(spec, args, config) if all_backends else [spec]
    if own_process:
        spec, profiles = _own_process(spec), [_own_process(p) for p in profiles]
    return Workspace(config, spec, profiles, settings_from(args, config))


def _own_process(spec: BackendSpec) -> BackendSpec:
    if spec.kind != "local":
        return spec
    return replace(spec, local=replace(spec.local, own_process=True))


def fail(message: str, code: int = 2) -> int:
    """Print `message` as phasechat's one-line error (controls made visible); the exit code."""
    print(f"phasechat: {visible_controls(message)}", file=sys.stderr)
    return code


#: The largest id SQLite can store (a signed 64-bit integer).
MAX_ID = 2**63 - 1


def parse_chat_id(value: str) -> int:
    """A chat id as typed; ValueError (one line) for anything but a chat id."""
    # ASCII digits only: int() would also take "1_0", " 7 " and "١" (Arabic-Indic one).
    if (
        not (value.isascii() and value.isdigit())
        or len(value) > 19
        or not 1 <= int(value) <= MAX_ID
    ):
        raise ValueError(f"not a chat id: {value!r} (ids are numbers; see `phasechat chats`)")
    return int(value)
