"""Writing exports into phasechat's exports folder without following planted links.

An export lands at a predictable name (`chat-3.md`), in a folder others might reach: a
symlink planted there must not turn an export into an overwrite of its target. Files are
opened with `O_NOFOLLOW` (a link at the final name is refused) in a folder that is
created private (0700) and checked to be a real directory, not a link. Each function
raises OSError with a one-line message; the caller shows it.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from phasechat.chat.config.paths import exports_dir, private_dir
from phasechat.chat.conversation import Conversation
from phasechat.chat.store.database import default_title
from phasechat.chat.store.export import to_json, to_markdown
from phasechat.chat.store.schema import ChatSummary

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def export_folder() -> Path:
    """The exports folder, created private; OSError when it is a link or not a folder."""
    folder = exports_dir()
    if folder.is_symlink():
        raise OSError(f"{folder} is a symlink: not writing exports through it")
    if folder.exists() and not folder.is_dir():
        raise OSError(f"{folder} is not a folder: move it away to export")
    private_dir(folder)
    return folder


def write_export(path: Path, text: str) -> None:
    """Write `text` to `path` (0600), replacing a regular file there; a symlink (or any
    other non-regular file) at `path` is refused, never followed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o600)
    except OSError as exc:
        if path.is_symlink():
            raise OSError(f"{path} is a symlink: export not written") from exc
        raise OSError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device: never write into it
            raise OSError(f"{path} is not a regular file: export not written")
        os.ftruncate(fd, 0)
        data = text.encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_chat_files(
    chat: ChatSummary,
    conversation: Conversation,
    stem: str,
    ids: Mapping[int, int] | None = None,
) -> Path:
    """Write `stem.md` (the branch shown) and `stem.json` (every branch; `ids` as
    `to_json` takes them) into the exports folder; returns the .md path."""
    folder = export_folder()
    md = folder / f"{stem}.md"
    write_export(md, to_markdown(chat, conversation))
    write_export(folder / f"{stem}.json", to_json(chat, conversation, ids) + "\n")
    return md


def unsaved_summary(conversation: Conversation, chat_id: int | None) -> ChatSummary:
    """A summary for a conversation held only in memory (its save failed)."""
    first = next((m.content for m in conversation.messages if m.role == "user"), "")
    answers = [m for m in conversation.messages if m.role == "assistant"]
    now = datetime.now(UTC)
    return ChatSummary(
        chat_id or 0,
        default_title(first) or "(untitled)",
        conversation.system,
        answers[-1].backend if answers else None,
        answers[-1].model if answers else None,
        len(conversation.messages),
        now,
        now,
    )


def memory_stem(chat_id: int | None) -> str:
    """The file name (no suffix) of an export made from memory."""
    return f"chat-{chat_id}-memory" if chat_id else f"chat-unsaved-{time.strftime('%Y%m%d-%H%M%S')}"
