"""`phasechat endpoints`: the config's `[[endpoints]]` profiles listed with what each
server answered just now, one added by its URL (probed first), one removed.

Only the table added or removed changes in the file (chat/config/write.py). A key is
never taken on the command line: `--key-env` names the variable that holds it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace

from phasechat.backends.remote.httplog import redact_url
from phasechat.backends.remote.probe import Probe, base_url_of, probe
from phasechat.chat.config import edit
from phasechat.chat.config.file import Config, ConfigError, EndpointProfile
from phasechat.chat.config.write import save_config
from phasechat.chat.text import one_line, visible_controls
from phasechat.cli.commands.options import fail, read_config


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `endpoints` and its subcommands to the top-level subparsers."""
    p = sub.add_parser(
        "endpoints", help="servers in the config: list, add by URL, remove", allow_abbrev=False
    )
    cmd = p.add_subparsers(dest="endpoints_command")
    cmd.add_parser("list", help="each profile and what its server answers now", allow_abbrev=False)
    add = cmd.add_parser(
        "add", help="probe a server and save it as an [[endpoints]] profile", allow_abbrev=False
    )
    add.add_argument("url", help="its base URL (http://host:port, /v1 is added)")
    add.add_argument("--name", help="the profile's name (default: the server's family)")
    add.add_argument(
        "--key-env", help="the environment variable that holds its API key (never the key)"
    )
    add.add_argument(
        "--pick", metavar="MODEL", help="the model to ask for, where the server lists several"
    )
    remove = cmd.add_parser("remove", help="remove a profile from the config", allow_abbrev=False)
    remove.add_argument("name")


def run(args: argparse.Namespace) -> int:
    """Run `phasechat endpoints ...`; returns the exit status."""
    try:
        config = read_config(args)
        command = args.endpoints_command or "list"
        if command == "list":
            return asyncio.run(_list(config))
        if command == "add":
            return asyncio.run(_add(config, args))
        assert command == "remove"
        path = save_config(edit.remove_profile(config, args.name), config.path)
        print(f"removed {visible_controls(args.name)} from {path}")
        return 0
    except (ConfigError, ValueError, OSError) as exc:
        return fail(visible_controls(one_line(str(exc))))


async def _list(config: Config) -> int:
    if not config.endpoints:
        print("no endpoints in the config: `phasechat endpoints add URL` adds one")
        return 0
    for e in config.endpoints:
        e.install_key()  # an inline key (warned about) is sent as the chat would send it
    said = await asyncio.gather(*(probe(e.base_url, e.api_key_env) for e in config.endpoints))
    for e, answer in zip(config.endpoints, said, strict=True):
        model = e.model or "server default"
        key = f" · key ${e.api_key_env}" if e.api_key_env != "OPENAI_API_KEY" else ""
        line = f"{e.name}  {redact_url(e.base_url)} · {model}{key}"
        print(visible_controls(line))
        print(visible_controls(f"    now: {_now(answer, e.model)}"))
    return 0


def _now(answer: Probe, model: str | None) -> str:
    if answer.ok and model is not None and model not in answer.models:
        return f"{answer.line()} (it does not list {model})"
    return answer.line()


async def _add(config: Config, args: argparse.Namespace) -> int:
    url = base_url_of(args.url)
    same = edit.endpoint_at(config, url)
    if same is not None:
        return fail(visible_controls(f"{redact_url(url)} is already the profile {same}"))
    key_env = args.key_env or "OPENAI_API_KEY"
    if args.key_env and args.key_env not in os.environ:  # whether it is set, never its value
        print(
            f"phasechat: ${visible_controls(args.key_env)} is not set: the server will get no key",
            file=sys.stderr,
        )
    answer = await probe(url, key_env)
    if not answer.ok:
        return fail(visible_controls(one_line(answer.line())), 1)
    model = args.pick
    if model is not None and model not in answer.models:
        listed = ", ".join(answer.models[:20])
        return fail(visible_controls(f"{url} does not list {model!r} (it lists: {listed})"))
    name = args.name or edit.free_name(config, answer.slug)
    endpoint = EndpointProfile(name, url, model=model)
    if args.key_env:
        endpoint = replace(endpoint, api_key_env=args.key_env)
    path = save_config(edit.add_endpoint(config, endpoint), config.path)
    print(visible_controls(f"added {name}: {answer.line()} (saved in {path})"))
    if model is None and len(answer.models) > 1:
        others = ", ".join(answer.models[:20])
        print(
            visible_controls(
                f"it lists {len(answer.models)} models: {others}; the first answers "
                f"unless you pick one (endpoints add ... --pick MODEL, or Ctrl+B in the chat)"
            )
        )
    return 0
