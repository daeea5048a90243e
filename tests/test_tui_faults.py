"""Faults and bad input in the TUI: a 1 MB paste, blank prompts, a storm of stops, quitting
mid-answer, switching backend mid-stream, secrets on screen and model output that looks
like markup or terminal control.

The app runs under `App.run_test()` on the real bundled model (the session's
`local_backend`) or against tests/fault_server.py. Each test checks what the user sees
and that nothing is lost: the conversation in memory and the chat database the app
writes as it goes (in the temporary XDG_DATA_HOME set by conftest).
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.pilot import Pilot
from textual.widgets import OptionList

from phasechat.backends.events import Finished, GenerationRequest, Message
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.store.database import ChatStore
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.chats_screen import ChatsScreen
from phasechat.tui.screens.history_screen import HistoryScreen
from phasechat.tui.screens.switch_screen import SwitchScreen
from phasechat.tui.widgets.chat_widgets import MessageView, PromptInput
from phasechat.tui.widgets.markdown_view import MarkdownPiece
from tests.fault_server import FaultServer, fault_server_thread
from tests.helpers import stored_messages
from tests.test_local_faults import megabyte_paste
from tests.test_safety import CONTROL

#: Generous: the machine running the suite may be heavily loaded. A leak fails, not hangs.
LIMIT_S = 120.0
SECRET = "sk-phasechat-screenshot-5e3c1a9b7d2f4e60"


async def wait_for(condition: Callable[[], bool]) -> None:
    """Poll `condition` while the app runs. Plain sleeps, not `pilot.pause`: that also
    waits for every widget's queue with a fixed 30 s limit of its own, which a starved
    UI thread on a loaded machine can exceed."""
    async with asyncio.timeout(LIMIT_S):
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)


#: One run of text in Rich's SVG export, with the screen row it is clipped to.
SVG_TEXT = re.compile(r'<text [^>]*clip-path="url\(#terminal-\d+-line-(\d+)\)">([^<]*)</text>')


async def screen_text(pilot: Pilot[None]) -> str:
    """What the terminal shows, one line per screen row: the app's SVG screenshot
    (after a pause, so that what was just mounted has been laid out and drawn), its runs
    of text joined by row and their XML escapes undone."""
    await pilot.pause(0.3)
    svg = pilot.app.export_screenshot()
    rows: dict[int, list[str]] = {}
    for row, text in SVG_TEXT.findall(svg):
        rows.setdefault(int(row), []).append(html.unescape(text).replace("\xa0", " "))
    assert rows, "no text in the screenshot"
    return "\n".join("".join(rows[r]) for r in sorted(rows))


def files_under(folder: Path) -> list[Path]:
    """Every file the test's config and data directories hold."""
    return [p for p in folder.rglob("*") if p.is_file()]


def notices(app: PhasechatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


# -- 1. a 1 MB paste into a 2,048-token context --------------------------------------------


@pytest.mark.model
async def test_1mb_paste_is_refused_in_one_line_and_kept(local_backend: LocalBackend) -> None:
    paste = megabyte_paste()
    app = PhasechatApp(settings=Settings(max_tokens=8, temperature=0), backend=local_backend)
    said: list[str] = []  # every notification, even one that timed out before the check
    notify = app.notify

    def recorded(message: str, *args: Any, **kwargs: Any) -> None:
        said.append(str(message))
        notify(message, *args, **kwargs)

    app.notify = recorded  # type: ignore[method-assign]
    async with app.run_test(size=(100, 40)) as pilot:
        app.post_message(events.Paste(paste))  # as the terminal driver delivers a paste
        await wait_for(lambda: app.query_one(PromptInput).text == paste)
        await pilot.press("enter")
        await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        exchange = app.turns.exchanges[0]
        assert exchange.user.content == paste  # sent whole: nothing silently cut
        assert exchange.trace.error is not None
        assert exchange.trace.error.kind == "context_overflow"
        error = exchange.answer.error
        assert error is not None and "\n" not in error
        assert "the context holds 2,048" in error
        assert "Trim the history" in error and "--n-ctx" in error  # the ways out
        assert error in said
        _system, user_view, answer_view = app.query(MessageView)
        assert user_view.message.content == paste  # on screen in full, not dropped
        assert error in str(answer_view.query_one(".footer").render())
        assert app.query_one(PromptInput).text == ""
    user, answer = stored_messages()
    assert user["content"] == paste and answer["status"] == "error" and answer["error"] == error


@pytest.mark.model
async def test_chat_goes_on_after_an_overflowing_paste(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=8, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 40)):
        app.chat.send("word " * 5000)  # any message that overflows: the 1 MB paste is slower
        await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        assert app.turns.exchanges[0].answer.status == "error"
        app.chat.send("Hi")
        await wait_for(lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        second = app.turns.exchanges[1].answer
        assert second.status == "complete", second.error
        assert app.turns.exchanges[0].user.content == "word " * 5000  # still kept


# -- 2. blank prompts ------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("typed", ["", " ", "\n\t  \n"])
async def test_blank_prompt_is_refused_and_nothing_added(
    local_backend: LocalBackend, typed: str
) -> None:
    app = PhasechatApp(backend=local_backend)
    async with app.run_test() as pilot:
        app.query_one(PromptInput).text = typed
        await pilot.press("enter")
        assert "empty prompt: type a message first" in notices(app)
        assert app.turns.conversation.messages == [] and app.turns.exchanges == []
        assert not app.query(MessageView) and not app.chat.generating
        assert app.query_one(PromptInput).text == typed  # left as it was
    with ChatStore() as store:
        assert store.list_chats() == []  # no empty chat was created


# -- 4. stop, stop, stop; quit mid-answer -----------------------------------------------


@pytest.mark.model
async def test_cancel_storm_leaves_every_answer_finished_and_saved(
    local_backend: LocalBackend,
) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=200, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 40)):
        for i in range(50):
            assert app.chat.send(f"Tell me a long story, number {i}.")
            if i % 2 == 0:  # stop mid-answer, once text has arrived

                def streaming(i: int = i) -> bool:
                    return len(app.turns.exchanges) > i and app.turns.exchanges[i].trace.tokens >= 1

                await wait_for(streaming)
            else:  # stop a moment after sending: in prefill, or before the request
                await asyncio.sleep(0.05)
            app.chat.action_stop()
            await wait_for(lambda: not app.chat.generating)
        exchanges = app.turns.exchanges
        assert len(exchanges) == 50 and app.turns.current is None
        assert {e.answer.status for e in exchanges} <= {"cancelled", "complete"}
        for e in exchanges[::2]:
            assert e.answer.content and e.answer.content == e.trace.text  # partial kept
        # The llama thread is free: a new request runs to its end.
        app.turns.update_settings(max_tokens=4)
        app.chat.send("Hi")
        await wait_for(lambda: len(app.turns.exchanges) == 51 and not app.chat.generating)
        assert app.turns.exchanges[-1].answer.status == "complete"
    rows = stored_messages()
    assert [r["status"] for r in rows if r["status"] == "streaming"] == []
    answers = [r for r in rows if r["role"] == "assistant"]
    assert [r["content"] for r in answers] == [e.answer.content for e in app.turns.exchanges]
    assert [r["status"] for r in answers] == [e.answer.status for e in app.turns.exchanges]


async def _quit_mid_answer(local_backend: LocalBackend) -> PhasechatApp:
    """Run the app, send, and leave run_test while the answer streams; then wait until the
    llama thread has stopped and check that it stopped at once (not at max_tokens)."""
    app = PhasechatApp(settings=Settings(max_tokens=1500, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 40)):
        app.chat.send("Write a very long story about the sea.")
        await wait_for(
            lambda: bool(app.turns.exchanges) and app.turns.exchanges[0].trace.tokens >= 3,
        )
    exchange = app.turns.exchanges[0]
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(LIMIT_S):  # the single llama thread takes new work again
        await loop.run_in_executor(local_backend._executor, lambda: None)
    assert exchange.trace.prompt is not None
    generated = local_backend._llm.n_tokens - exchange.trace.prompt.prompt_tokens
    assert generated < exchange.trace.tokens + 32  # stopped, not run on to 1,500 tokens
    events_ = [
        e
        async for e in local_backend.stream(
            GenerationRequest((Message("user", "Hi"),), max_tokens=2)
        )
    ]
    assert isinstance(events_[-1], Finished)
    return app


@pytest.mark.model
async def test_quit_mid_answer_keeps_the_partial_text(local_backend: LocalBackend) -> None:
    app = await _quit_mid_answer(local_backend)
    answer = app.turns.exchanges[0].answer
    user_row, answer_row = stored_messages()
    assert user_row["content"] == "Write a very long story about the sea."
    # The periodic flush saved text as it streamed: a prefix of what was shown.
    assert answer.content.startswith(answer_row["content"])
    with ChatStore() as store:
        (chat,) = store.list_chats()
        loaded = store.load(chat.id).messages[1]
    assert loaded.status == "cancelled"  # never shown as still streaming
    assert loaded.content == answer_row["content"]


@pytest.mark.model
async def test_quit_mid_answer_saves_the_final_state(local_backend: LocalBackend) -> None:
    app = await _quit_mid_answer(local_backend)
    answer = app.turns.exchanges[0].answer
    _, answer_row = stored_messages()
    assert answer.status == "cancelled"
    assert answer_row["status"] == "cancelled" and answer_row["content"] == answer.content


@pytest.mark.model
async def test_stop_right_after_send_leaves_the_app_usable(local_backend: LocalBackend) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=4, temperature=0), backend=local_backend)
    async with app.run_test(size=(100, 40)):
        app.chat.send("Hello")
        app.chat.action_stop()  # Enter then Esc, handled before the worker's first step
        await wait_for(lambda: not [w for w in app.workers if w.group == "generate"])
        assert not app.chat.generating
        assert app.chat.send("Hello again")
        await wait_for(lambda: not app.chat.generating)
        assert app.turns.exchanges[-1].answer.status == "complete"


# -- 5. switching backend mid-stream -----------------------------------------------------


def remote(
    server: FaultServer, name: str, model: str, api_key_env: str = RemoteConfig().api_key_env
) -> BackendSpec:
    config = RemoteConfig(base_url=server.base_url, model=model, name=name, api_key_env=api_key_env)
    return BackendSpec("openai", remote=config)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    """The fault server on its own thread: the app's loop never delays its behaviour."""
    with fault_server_thread() as s:
        yield s


async def test_switch_mid_stream_closes_the_connection_and_keeps_the_text(
    server: FaultServer,
) -> None:
    slow, other = remote(server, "slow", "trickle-600"), remote(server, "other", "ok-3")
    app = PhasechatApp(slow, Settings(max_tokens=64), profiles=[other])
    async with app.run_test(size=(100, 40)):
        await wait_for(lambda: app.backend.state == "ready")
        app.chat.send("hello")
        await wait_for(lambda: bool(app.turns.exchanges))
        first = app.turns.exchanges[0]
        await wait_for(lambda: first.trace.text == "tok ")  # then it dribbles on
        assert server.open_connections == 1
        await app.chat.switch_to("other")
        assert first.answer.status == "cancelled" and first.answer.content == "tok "
        await wait_for(lambda: server.open_connections == 0)
        await wait_for(lambda: app.backend.state == "ready")
        app.chat.send("again")
        await wait_for(lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        assert app.turns.exchanges[1].answer.content == "tok tok tok "
    rows = stored_messages()
    assert [(r["content"], r["status"]) for r in rows[1::2]] == [
        ("tok ", "cancelled"),
        ("tok tok tok ", "complete"),
    ]
    assert server.open_connections == 0


# -- 6. secrets never on screen or on disk -------------------------------------------------


async def test_api_key_is_in_no_screenshot_file_or_export(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PHASECHAT_SCREEN_KEY", SECRET)
    key = {"api_key_env": "PHASECHAT_SCREEN_KEY"}
    ok, echo = remote(server, "ok", "ok-3", **key), remote(server, "echo", "echokey-stream", **key)
    app = PhasechatApp(ok, Settings(max_tokens=16), profiles=[echo])
    shots: dict[str, str] = {}
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for(lambda: app.backend.state == "ready")
        app.chat.send("hello")
        await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        await app.chat.switch_to("echo")  # a careless server that quotes the key in its error
        await wait_for(lambda: app.backend.state == "ready")
        app.chat.send("again")
        await wait_for(lambda: len(app.turns.exchanges) == 2 and not app.chat.generating)
        shots["chat"] = await screen_text(pilot)
        await pilot.press("ctrl+b")
        assert isinstance(app.screen, SwitchScreen)
        shots["switch"] = await screen_text(pilot)
        await pilot.press("escape", "f2")
        assert isinstance(app.screen, HistoryScreen)
        await pilot.press("j", "c")  # export JSONL and CSV
        shots["history"] = await screen_text(pilot)
        await pilot.press("escape", "f3")
        assert isinstance(app.screen, ChatsScreen)
        chats = app.screen.query_one(OptionList)
        chats.highlighted = 0
        chats.focus()  # Ctrl+E in the search box is the Input's own "end" key
        await pilot.press("ctrl+e")  # export the chat as Markdown and JSON
        shots["chats"] = await screen_text(pilot)
    # it was sent (the switcher's look for local servers asks /models, keyless, after it)
    assert f"Bearer {SECRET}" in {h.get("authorization") for h in server.headers}
    # The echoed key reached the screen, redacted, so the screenshot did show the error.
    assert "Bearer sk-…redacted" in shots["chat"]
    for name, shot in shots.items():
        assert SECRET not in shot and SECRET[-16:] not in shot, name
    files = files_under(tmp_path)
    names = {p.name for p in files}
    assert {"chats.db", "chat-1.md", "chat-1.json"} <= names
    assert {p.suffix for p in files} >= {".jsonl", ".csv"}
    for path in files:  # the database (and any WAL left), exports, the config
        assert SECRET[-16:].encode() not in path.read_bytes(), path


async def test_password_in_base_url_is_not_on_the_switch_screen(server: FaultServer) -> None:
    url = server.base_url.replace("://", "://me:hunter2-url-secret@")
    spec = BackendSpec("openai", remote=RemoteConfig(base_url=url, model="ok-3", name="pw"))
    app = PhasechatApp(spec, Settings(max_tokens=8))
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for(lambda: app.backend.state == "ready")
        await pilot.press("ctrl+b")
        assert isinstance(app.screen, SwitchScreen)
        assert "hunter2-url-secret" not in await screen_text(pilot)


async def test_status_bar_leaves_streaming_when_the_answer_ends(server: FaultServer) -> None:
    app = PhasechatApp(remote(server, "faults", "ok-3"), Settings(max_tokens=8))
    async with app.run_test(size=(110, 40)):
        await wait_for(lambda: app.backend.state == "ready")
        app.chat.send("hi")
        await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        status = app.query_one("#status")
        await wait_for(lambda: "streaming" not in str(status.render()))


# -- 7. model output is data --------------------------------------------------------------


async def test_markup_and_escapes_from_the_model_are_shown_not_obeyed(
    server: FaultServer,
) -> None:
    app = PhasechatApp(remote(server, "faults", "markup"), Settings(max_tokens=64))
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for(lambda: app.backend.state == "ready")
        app.chat.send("hi")
        await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        assert app.turns.exchanges[0].answer.status == "complete"
        shown = await screen_text(pilot)
        assert "[bold red]not bold[/] [@click=app.quit]click[/]" in shown  # verbatim
        for piece in ("␛[31mred␛[0m", "\\x9b31mc1red", "␛]52;c;cHduZWQ=␇bell␇", "nul␀ end"):
            assert piece in shown  # visible, not obeyed
        assert CONTROL.search(shown) is None  # no ESC, BEL, NUL, C1 or OSC introducer
        view = app.query(MessageView).last()
        region = view.region
        actions = {
            str(app.screen.get_style_at(x, y).meta.get("@click"))
            for y in range(region.y, region.bottom)
            for x in range(region.x, region.right)
        }
        # Markdown makes the bare URL a link (checked, then opened on click); no other
        # action, and none the text names, is reachable from the answer's text.
        assert all(a == "None" or a.startswith("('app.follow_link', (") for a in actions), actions
        paragraph = view.query(MarkdownPiece).first()
        column = len("[bold red]not bold[/] [@click=app.quit]c")  # on the word "click"
        await pilot.click(paragraph, offset=(column, 0))
        await pilot.pause(0.2)
        assert app.is_running and app.return_code is None  # the click did nothing
