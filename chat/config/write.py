"""Writing the config file back without losing the user's own text.

A theme change or a settings save edits the file the user wrote: comments, key order,
blank lines and untouched values survive (tomlkit, as harlequin writes its config).
Only keys whose value changed are rewritten. A config that is a symbolic link (dotfile
managers) is written through to its target and stays a link. A file that holds an
inline API key is written 0600.
"""

from __future__ import annotations

import os
import stat
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Table
from tomlkit.toml_document import TOMLDocument

from phasechat.chat.config.file import Config, ConfigError, parse_config
from phasechat.chat.config.paths import config_path
from phasechat.chat.config.settings import Settings, TrimConfig

HEADER = "phasechat config (the schema: chat/config.py)"


def _plain(value: Any) -> Any:
    """A value as plain Python, for comparing a file's value with ours."""
    if hasattr(value, "unwrap"):
        value = value.unwrap()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _fields(obj: Any) -> dict[str, Any]:
    """The dataclass's fields that have a TOML spelling (None means: the default)."""
    return {k: _plain(v) for k, v in asdict(obj).items() if v is not None}


def _set_table(doc: TOMLDocument, name: str, obj: Any, default: Any) -> None:
    if name not in doc:
        if obj == default:
            return  # a section the user never wrote stays unwritten while it is the default
        doc[name] = tomlkit.table()
    table = doc[name]
    assert isinstance(table, Table)
    _edit(table, obj, _fields(default))


def _edit(table: Table, obj: Any, defaults: dict[str, Any]) -> None:
    """`table` edited in place to say what `obj` says: only the keys that differ."""
    wanted = _fields(obj)
    for f in fields(obj):
        key = f.name
        if key not in wanted:
            if key in table:
                del table[key]
        elif key not in table and wanted[key] == defaults.get(key):
            continue  # a default the user never wrote stays unwritten
        elif _plain(table.get(key)) != wanted[key]:
            table[key] = wanted[key]


def _defaults(profile: Any) -> dict[str, Any]:
    return {f.name: f.default for f in fields(profile) if f.default is not MISSING}


def _written(profile: Any) -> dict[str, Any]:
    """A profile's fields as a new table spells them: defaults left out."""
    defaults = _defaults(profile)
    return {k: v for k, v in _fields(profile).items() if defaults.get(k, MISSING) != v}


def _new_table(profile: Any) -> Table:
    table = tomlkit.table()
    table.update(_written(profile))
    table.add(tomlkit.nl())  # a blank line before whatever follows it in the file
    return table


def _set_profiles(
    doc: TOMLDocument, name: str, profiles: tuple[Any, ...], current: tuple[Any, ...]
) -> None:
    if profiles == current:
        return  # unchanged: the user's tables, comments included, stay as written
    if not profiles:
        doc.pop(name, None)
        return
    aot = doc.get(name)
    if isinstance(aot, AoT) and len(aot) == len(current) and _edit_in_place(aot, profiles, current):
        return
    aot = AoT([])
    for profile in profiles:
        table = tomlkit.table()
        table.update(_written(profile))
        aot.append(table)
    doc[name] = aot


def _edit_in_place(aot: AoT, profiles: tuple[Any, ...], current: tuple[Any, ...]) -> bool:
    """The one change the app makes at a time, made to the user's own tables (their
    comments and order kept): a profile added at the end, one removed, or each edited
    where it stands (a rename, a model chosen). False for any other change."""
    if len(profiles) == len(current) + 1 and profiles[:-1] == current:
        aot.append(_new_table(profiles[-1]))
        return True
    if len(profiles) == len(current) - 1:
        gone = next(
            (i for i in range(len(current)) if current[:i] + current[i + 1 :] == profiles), None
        )
        if gone is None:
            return False
        del aot[gone]
        return True
    if len(profiles) != len(current):
        return False
    for table, profile in zip(aot, profiles, strict=True):
        _edit(table, profile, _defaults(profile))
    return True


def merge(doc: TOMLDocument, config: Config, current: Config) -> TOMLDocument:
    """`doc` (which says `current`) edited in place to say what `config` says."""
    if config.theme is None:
        doc.pop("theme", None)
    elif doc.get("theme") != config.theme:
        doc["theme"] = config.theme
    _set_table(doc, "engine", config.engine, Settings())
    _set_table(doc, "trim", config.trim, TrimConfig())
    _set_profiles(doc, "endpoints", config.endpoints, current.endpoints)
    _set_profiles(doc, "local", config.local, current.local)
    return doc


def dump_config(config: Config) -> str:
    """The config as TOML text for a new file (`parse_config` reads it back equal)."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment(HEADER))
    if config.theme is not None:
        doc["theme"] = config.theme
    doc["engine"] = tomlkit.table()
    return tomlkit.dumps(merge(doc, config, Config()))


def save_config(config: Config, path: Path | None = None) -> Path:
    """Write `config` atomically (default: where it was read from, else `config_path()`),
    editing the existing file rather than replacing its text. Returns the path written.

    A config holding an inline API key is written with mode 0600 (also when the file
    existed with a wider mode); otherwise an existing file keeps its mode and a new one
    gets the umask's.
    """
    path = (path or config.path or config_path()).resolve()  # through a symlink
    path.parent.mkdir(parents=True, exist_ok=True)
    mode: int | None = None  # a new file: the umask decides
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        old = path.read_text(encoding="utf-8")
        text = tomlkit.dumps(merge(tomlkit.parse(old), config, parse_config(old, path)))
    except FileNotFoundError:
        text = dump_config(config)
    except (TOMLKitError, ConfigError, UnicodeDecodeError):
        text = dump_config(config)  # no longer valid (edited meanwhile): written anew
    if config.has_inline_key:
        mode = 0o600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # The mode is set at creation, so the key is never readable by others, not even briefly.
    tmp.unlink(missing_ok=True)  # a stale temp file from a crashed save
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)  # exactly this mode, whatever the umask
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
