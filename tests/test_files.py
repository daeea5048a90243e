"""phasechat's files: private where they hold chats, and the user's config kept as
written when phasechat saves a setting into it."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

from phasechat.chat.config.file import load_config
from phasechat.chat.config.paths import config_path, data_dir, db_path
from phasechat.chat.config.settings import TrimConfig
from phasechat.chat.config.write import save_config
from phasechat.chat.store.database import ChatStore

USER_FILE = """\
# phasechat, set up by hand
theme = "phasechat-dark"   # dark, for the night

[engine]
# a long system prompt I tune often
system = "You are terse."
temperature = 0.2  # low: reproducible answers
max_tokens = 256

[[endpoints]]
name = "lab"   # the GPU box
base_url = "http://127.0.0.1:8080/v1"
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_theme_change_and_a_settings_save_keep_comments_and_order() -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE)
    config = load_config()
    save_config(replace(config, theme="phasechat-light"))
    engine = replace(config.engine, max_tokens=300)
    save_config(replace(load_config(), engine=engine, trim=TrimConfig(keep_last=2)))
    text = path.read_text()
    expected = (
        USER_FILE.replace('"phasechat-dark"', '"phasechat-light"')
        .replace("max_tokens = 256", "max_tokens = 300")
        .rstrip("\n")
    )
    assert text.startswith(expected)  # every comment, blank line and key order kept
    assert text[len(expected) :].strip() == "[trim]\nkeep_last = 2"
    assert load_config().trim == TrimConfig(keep_last=2)


def test_a_symlinked_config_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles" / "phasechat.toml"
    dotfiles.parent.mkdir()
    dotfiles.write_text(USER_FILE)
    link = config_path()
    link.parent.mkdir(parents=True)
    link.symlink_to(dotfiles)
    save_config(replace(load_config(), theme="phasechat-light"))
    assert link.is_symlink() and link.resolve() == dotfiles
    assert 'theme = "phasechat-light"' in dotfiles.read_text()


def test_the_chat_database_and_its_folder_are_private() -> None:
    with ChatStore() as store:
        store.create_chat()  # a write: the WAL files exist while the store is open
        assert store.notices == []
        assert mode(data_dir()) == 0o700
        for suffix in ("", "-wal", "-shm"):
            f = db_path().with_name("chats.db" + suffix)
            assert f.exists() and mode(f) == 0o600, f


def test_a_readable_data_folder_and_database_are_tightened_with_a_notice() -> None:
    folder = data_dir()
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(folder, 0o755)
    with ChatStore() as store:
        store.create_chat()
    os.chmod(db_path(), 0o644)
    with ChatStore() as store:
        assert mode(folder) == 0o700 and mode(db_path()) == 0o600
        assert any("chats.db" in n and "644" in n for n in store.notices)
    os.chmod(folder, 0o755)
    with ChatStore() as store:
        assert any(str(folder) in n and "755" in n for n in store.notices)
