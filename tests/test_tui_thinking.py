"""The TUI with a thinking model: the live panel's thinking phase, and the thinking as a
folded block under the answer's header that a key (or a click) unfolds."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import LivePanel, MessageView
from tests.fault_server import FaultServer
from tests.test_snapshots import METRICS, make_app
from tests.test_tui_faults import wait_for


def panel_text(app: PhasechatApp) -> str:
    return app.query_one(LivePanel)._content.plain


async def test_thinking_phase_live_then_a_folded_block() -> None:
    async with FaultServer() as server:
        config = RemoteConfig(base_url=server.base_url, model="thinkslow-40-1")
        app = PhasechatApp(settings=Settings(max_tokens=64), backend=RemoteBackend(config))
        async with app.run_test(size=(100, 34)) as pilot:
            assert app.chat.send("hi")
            await wait_for(lambda: app.turns.current is not None)
            exchange = app.turns.exchanges[-1]
            await wait_for(lambda: exchange.live().phase == "thinking" and bool(exchange.reasoning))
            await wait_for(lambda: "thinking" in panel_text(app).split("\n")[0])
            panel = panel_text(app)
            assert "thinking chunks" in panel and "prefill | thinking | answer" in panel
            await wait_for(lambda: not app.chat.generating)
            view = app.query(MessageView).last()
            block = view.thinking
            # Folded, titled with its figures, and its text not even rendered yet.
            assert block.is_mounted and block.display and block.collapsed
            # The question has neither a thinking block nor a footer (widgets that every
            # layout pass would walk, for nothing).
            assert not app.query(MessageView).first().query(".thinking, .footer")
            assert "thinking" in block.title and "tokens" in block.title
            text = view.query_one(".thinking-text", Static)
            assert "think0" not in str(text.render())
            assert "answering" not in panel_text(app) and "thought" in panel_text(app)
            await pilot.press("ctrl+o")
            await wait_for(lambda: not block.collapsed)
            await pilot.pause()
            assert "think0 think1" in str(text.render())
            await pilot.press("ctrl+o")
            await wait_for(lambda: block.collapsed)
        await app.turns.backend.aclose()


def thinking_conversation() -> Conversation:
    c = Conversation()
    c.add(ChatMessage("user", "What is 2 + 2?"))
    metrics = {**METRICS, "reasoning_ms": 1840.0, "reasoning_tokens": 57, "ttfo_ms": 1960.0}
    c.add(
        ChatMessage(
            "assistant",
            "**4**.",
            backend="openai",
            model="qwen3-0.6b",
            metrics=metrics_from_dict({**metrics, "reasoning_tokens_source": "server"}),
            reasoning="The user asks for 2 + 2.\nThat is 4; answer briefly.",
        )
    )
    return c


def test_saved_thinking_unfolded_by_its_key(snap_compare: Any) -> None:
    async def show(pilot: Any) -> None:
        app = pilot.app
        await app.chat.show_conversation(thinking_conversation())
        await pilot.pause()
        await pilot.press("ctrl+o")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(100, 24), run_before=show)
