"""The TUI when things go wrong: links of any scheme, a full disk, a locked database, an
exports folder that is a file or holds a planted symlink. Real SQLite files and real
symlinks; the backend is scripted (these tests are about the app, not the model)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from textual.widgets import OptionList

from phasechat.chat.config.paths import db_path, exports_dir
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.chats_screen import ChatsScreen
from phasechat.tui.screens.confirm import ConfirmScreen
from phasechat.tui.widgets.chat_widgets import MessageView
from tests.helpers import stored_messages, wait_for
from tests.scripted import ScriptedBackend
from tests.test_store_hostile import fill_disk, free_disk


class App(PhasechatApp):
    """The app, remembering what it would have handed to the browser."""

    def __init__(self, backend: ScriptedBackend, settings: Settings | None = None) -> None:
        super().__init__(backend=backend, settings=settings)
        self.opened: list[str] = []

    def open_url(self, url: str, *, new_tab: bool = True) -> None:
        self.opened.append(url)


def said(app: PhasechatApp) -> list[str]:
    return [n.message for n in app._notifications]


async def send(app: PhasechatApp, pilot: object, text: str) -> None:
    n = len(app.turns.exchanges)
    assert app.chat.send(text)
    await wait_for(pilot, lambda: len(app.turns.exchanges) > n and not app.chat.generating)  # type: ignore[arg-type]


async def test_links_open_only_http_and_only_after_the_url_is_shown() -> None:
    app = App(
        ScriptedBackend(text="see [this](https://example.com/a) or [that](file:///etc/passwd)")
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await send(app, pilot, "links please")

        def clickable() -> dict[str, tuple[int, int]]:
            """URL -> a cell of the answer on screen that opens it on click."""
            region = list(app.query(MessageView))[-1].region
            links: dict[str, tuple[int, int]] = {}
            for y in range(region.y, region.bottom):
                for x in range(region.x, region.right):
                    action = app.screen.get_style_at(x, y).meta.get("@click")
                    if action is not None:
                        assert action[0] == "app.follow_link", action  # nothing else reachable
                        links.setdefault(action[1][0], (x, y))
            return links

        # The answer is final before its last frame is painted: probe once it is.
        await wait_for(pilot, lambda: bool(clickable()))
        links = clickable()
        # markdown-it does not even make a file: link; only the https one is clickable
        assert set(links) == {"https://example.com/a"}
        for href in ("file:///etc/passwd", "javascript:alert(1)", "https://x\x1b]0;t\x07"):
            app.action_follow_link(href)  # as a click would, with any URL a model writes
            await pilot.pause()
        assert app.opened == []
        assert sum("link not opened" in m for m in said(app)) == 3
        # the three notices are toasts over the screen: one may cover the link's cell
        app.clear_notifications()
        await pilot.pause()
        await pilot.click(offset=clickable()["https://example.com/a"])
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert app.screen.detail == "https://example.com/a"  # type: ignore[attr-defined]
        await pilot.press("y")
        await wait_for(pilot, lambda: app.opened == ["https://example.com/a"])


async def test_full_disk_is_shown_at_once_retried_and_the_chat_exported_from_memory() -> None:
    app = App(ScriptedBackend(text="the answer " * 500))
    async with app.run_test(size=(120, 40)) as pilot:
        await send(app, pilot, "first")
        store = app.workspace.store
        assert store is not None
        fill_disk(store)
        await send(app, pilot, "second, while the disk is full " * 50)
        # a write that failed, naming the file: it once said "cannot read the chat database"
        written = f"chat not saved: cannot write {db_path()}: database or disk is full"
        assert any(m.startswith(written) for m in said(app)), said(app)
        # not all of it reached the file: a real full disk still takes what fits in the
        # database's free pages (the question may), never the whole answer
        said_here = [m.content for m in app.turns.conversation.messages]
        assert [r["content"] for r in stored_messages()] != said_here
        answer = app.query(MessageView).last()  # the answer stays on screen, whole
        assert answer.markdown.source == app.turns.conversation.messages[-1].content
        assert answer.markdown.source.startswith("the answer")
        app.chat.action_export_chat()  # "Export this chat": from memory, everything said so far
        md = exports_dir() / f"chat-{app.workspace.chat_id()}-memory.md"
        assert "second, while the disk is full" in md.read_text()
        free_disk(store)
        await wait_for(pilot, lambda: "chat saved again" in " ".join(said(app)))
        assert [r["content"] for r in stored_messages()] == [
            m.content for m in app.turns.conversation.messages
        ]


async def test_full_disk_before_the_first_send_keeps_the_prompt_and_saves_it_later() -> None:
    app = App(ScriptedBackend(text="ok"), Settings(system="a long system prompt " * 400))
    async with app.run_test(size=(120, 40)) as pilot:
        store = app.workspace.store
        assert store is not None
        fill_disk(store)
        await send(app, pilot, "my precious prompt")  # used to crash here, prompt lost
        assert any("chat not saved" in m for m in said(app))
        assert app.turns.conversation.messages[0].content == "my precious prompt"
        free_disk(store)
        await send(app, pilot, "next")
        assert [r["content"] for r in stored_messages()][:3] == [
            "my precious prompt",
            "ok ",
            "next",
        ]


async def open_chats(app: PhasechatApp, pilot: object) -> ChatsScreen:
    await pilot.press("f3")  # type: ignore[attr-defined]
    await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))  # type: ignore[arg-type]
    screen = app.screen
    assert isinstance(screen, ChatsScreen)
    options = screen.query_one(OptionList)
    options.focus()  # the search box would take ctrl+d as "delete right"
    options.highlighted = 0
    return screen


async def test_delete_asks_first_and_a_locked_database_is_one_line() -> None:
    app = App(ScriptedBackend(text="ok"))
    async with app.run_test(size=(120, 40)) as pilot:
        await send(app, pilot, "keep me")
        screen = await open_chats(app, pilot)
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen)
        assert len(app.workspace.store.list_chats()) == 1  # type: ignore[union-attr]
        app.workspace.store._db.execute("PRAGMA busy_timeout = 200")  # type: ignore[union-attr]
        with closing(sqlite3.connect(db_path())) as other:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: any("not deleted" in m for m in said(app)))
            other.rollback()
        assert any("database is locked" in m for m in said(app))
        assert app.is_running and len(app.workspace.store.list_chats()) == 1  # type: ignore[union-attr]
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.workspace.store.list_chats() == [])  # type: ignore[union-attr]


async def test_export_never_follows_a_planted_symlink_and_a_bad_folder_is_one_line(
    tmp_path: Path,
) -> None:
    app = App(ScriptedBackend(text="ok"))
    async with app.run_test(size=(120, 40)) as pilot:
        await send(app, pilot, "export me")
        chat_id = app.workspace.chat_id()
        folder = exports_dir()
        folder.mkdir(parents=True)
        target = tmp_path / "precious.txt"
        target.write_text("do not overwrite")
        (folder / f"chat-{chat_id}.md").symlink_to(target)
        await open_chats(app, pilot)
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: any("export failed" in m for m in said(app)))
        assert target.read_text() == "do not overwrite"
        assert any("is a symlink" in m for m in said(app))
        (folder / f"chat-{chat_id}.md").unlink()
        folder.rmdir()
        folder.write_text("a file where the exports folder should be")
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: any("is not a folder" in m for m in said(app)))
        assert app.is_running


async def test_notifications_are_plain_text_whatever_the_caller_asks() -> None:
    app = App(ScriptedBackend())
    async with app.run_test(size=(120, 40)) as pilot:
        app.notify("[/] \x1b]52;c;eA==\x07 [bold]x", title="\x1b]0;t\x07", markup=True)
        await pilot.pause()
        note = list(app._notifications)[-1]
        assert note.message == "[/] ␛]52;c;eA==␇ [bold]x" and note.title == "␛]0;t␇"
        assert note.markup is False and app.is_running
