"""Where phasechat keeps its files, and keeping them private.

One module for every path (config, user themes, the chat database, exports), found
through platformdirs: `PHASECHAT_CONFIG` overrides the config file, `XDG_CONFIG_HOME`,
`XDG_DATA_HOME` and `XDG_CACHE_HOME` move the folders. Chats are private: the data
directory is made 0700 and the database files 0600; an existing directory or file that
others can read is tightened, with a notice saying so. Nothing here runs at import time.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import platformdirs

APP = "phasechat"
CONFIG_ENV = "PHASECHAT_CONFIG"


def config_path() -> Path:
    """$PHASECHAT_CONFIG, else `config.toml` in the platform's user config directory."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


def themes_dir() -> Path:
    """User themes: `themes/` beside the config file."""
    return config_path().parent / "themes"


def data_dir() -> Path:
    """Chats and exports (XDG_DATA_HOME moves it)."""
    return Path(platformdirs.user_data_dir(APP))


def cache_dir() -> Path:
    """Measurements worth keeping between runs (XDG_CACHE_HOME moves it)."""
    return Path(platformdirs.user_cache_dir(APP))


def db_path() -> Path:
    """The chat database."""
    return data_dir() / "chats.db"


def exports_dir() -> Path:
    """Where the UI writes exports."""
    return data_dir() / "exports"


def private_dir(path: Path) -> str | None:
    """Create `path` (and parents) as 0700; tighten it if others can read it.

    Returns a one-line notice when an existing directory was tightened, else None.
    Raises OSError when it cannot be created.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return _tighten(path, 0o700)


def private_file(path: Path) -> str | None:
    """Make an existing file 0600 if others can read it; a notice when it was tightened."""
    if not path.exists():
        return None
    return _tighten(path, 0o600)


def _tighten(path: Path, mode: int) -> str | None:
    if os.name != "posix":  # pragma: no cover - POSIX modes only
        return None
    current = stat.S_IMODE(path.stat().st_mode)
    if not current & 0o077:
        return None
    os.chmod(path, mode)
    return f"{path} was readable by other users ({current:o}); made it {mode:o}"
