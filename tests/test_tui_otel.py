"""The UI's requests traced (telemetry/otel.py): the app streams in a worker task of its
own, and the span the turn opened there is the one its request carries; leaving the app
closes the workspace, which sends what is pending."""

from __future__ import annotations

from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from tests.fault_server import fault_server_thread
from tests.otlp_receiver import Receiver
from tests.test_otel import remote, tree
from tests.test_tui_faults import wait_for


async def test_the_ui_sends_the_traceparent_from_its_worker_and_flushes_on_exit(
    otlp: Receiver,
) -> None:
    with fault_server_thread() as server:
        app = PhasechatApp(remote(server.base_url, "ok-3"), Settings(max_tokens=9))
        async with app.run_test(size=(100, 40)):
            await wait_for(lambda: app.backend.state == "ready")
            app.chat.send("hello")
            await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
        assert app.turns.exchanges[0].answer.status == "complete"
        root, children = tree(otlp)
        assert set(children) == {"prefill", "decode"}
        (sent,) = [h["traceparent"] for h in server.headers if "traceparent" in h]
        assert sent.split("-")[1:3] == [root.trace_id.hex(), root.span_id.hex()]
