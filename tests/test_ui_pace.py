"""The UI draws less while an engine on this machine's CPU generates (issue 13: the TUI
must not slow the engine it measures): which backends share the CPU, and how often a
streaming answer is drawn for one that does."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from phasechat.backends.events import Event, GenerationRequest
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets import chat_log
from phasechat.tui.widgets.chat_widgets import LivePanel, MessageView, PromptInput
from phasechat.tui.widgets.markdown_view import SHARED_STEP, STREAM_STEP, MarkdownBody
from phasechat.tui.widgets.telemetry_view import PanelLine
from tests.fault_server import fault_server_thread
from tests.test_tui_faults import wait_for


@pytest.mark.parametrize(
    ("url", "shares"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://192.168.1.20:8080/v1", False),
    ],
)
def test_a_server_on_loopback_shares_this_machines_cpu(url: str, shares: bool) -> None:
    assert RemoteBackend(RemoteConfig(base_url=url)).shares_cpu is shares


@pytest.mark.parametrize("gpu_layers", [0, 15, -1])
def test_a_local_engine_shares_this_process_on_a_gpu_too(gpu_layers: int) -> None:
    # Every layer on a GPU still leaves each token's Python (sampling, detokenizing,
    # stamping) under this process's interpreter lock: a UI drawing every frame took a
    # fifth of decode on an H200 (issue 35), so the UI is paced for any local engine.
    backend = LocalBackend(LocalConfig(gpu_layers=gpu_layers))
    backend.gpu_layers = gpu_layers  # as the load sets it
    assert backend.shares_cpu


def ask_every(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """What the turn controller asks the backend for: how often the UI reads the stream
    (`Backend.stream`'s `every_s`), one entry per request."""
    asked: list[float | None] = []
    stream = RemoteBackend.stream

    def recording(
        self: RemoteBackend, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        asked.append(every_s)
        return stream(self, request, every_s=every_s)

    monkeypatch.setattr(RemoteBackend, "stream", recording)
    return asked


async def test_an_answer_from_this_machine_is_drawn_at_the_shared_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draws: list[float] = []
    how: set[tuple[int, bool]] = set()  # (tail step, cursor blinks) at each draw
    append = MarkdownBody.append

    async def counted(self: MarkdownBody, text: str, step: int) -> None:
        draws.append(time.monotonic())
        how.add((step, self.app.query_one(PromptInput).cursor_blink))
        await append(self, text, step)

    monkeypatch.setattr(MarkdownBody, "append", counted)
    panels: list[tuple[float, bool]] = []  # (when, generating) of each panel drawn
    show = LivePanel.show

    def shown(self: LivePanel, lines: Sequence[PanelLine]) -> None:
        panels.append((time.monotonic(), self.app.chat.generating))  # type: ignore[attr-defined]
        show(self, lines)

    monkeypatch.setattr(LivePanel, "show", shown)
    asked = ask_every(monkeypatch)
    with fault_server_thread() as server:  # on 127.0.0.1: shares the CPU
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="paced-300-150"))
        app = PhasechatApp(settings=Settings(max_tokens=310), backend=backend)
        async with app.run_test(size=(100, 30)):
            await wait_for(lambda: backend.state == "ready")
            assert backend.shares_cpu
            t0 = time.monotonic()
            app.chat.send("go")
            await wait_for(lambda: bool(app.turns.exchanges) and not app.chat.generating)
            seconds = time.monotonic() - t0
            answer = app.turns.exchanges[-1].answer
            body = list(app.query(MessageView))[-1].markdown
            assert body.source == answer.content  # the last draw is forced: nothing lost
            assert answer.content.count("word") == 300
            # The engine was asked to hand tokens over once per draw, and the cursor
            # blinks again once the answer is final.
            assert asked == [1 / chat_log.SHARED_HZ]
            assert app.query_one(PromptInput).cursor_blink
        await backend.aclose()
    assert how == {(SHARED_STEP, False)}  # bigger steps, no blinking cursor meanwhile
    # Drawn as it streamed (2 s at 150 tokens/s), but never faster than SHARED_HZ
    # (+1: the forced draw at the end).
    assert len(draws) >= 3
    assert len(draws) <= seconds * chat_log.SHARED_HZ + 2
    gaps = [b - a for a, b in itertools.pairwise(draws[:-1])]  # the last one is forced
    assert min(gaps, default=1.0) >= 0.9 / chat_log.SHARED_HZ
    # The panel's figures: redrawn as it streamed, at the panel's own slower rate, and
    # once the answer is final.
    live = [t for t, generating in panels if generating]
    assert len(live) >= 2 and len(live) <= seconds * chat_log.SHARED_PANEL_HZ + 1
    assert min(b - a for a, b in itertools.pairwise(live)) >= 0.9 / chat_log.SHARED_PANEL_HZ
    assert not panels[-1][1]


async def test_an_answer_from_elsewhere_is_drawn_at_every_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    how: set[tuple[int, bool]] = set()
    append = MarkdownBody.append

    async def seen(self: MarkdownBody, text: str, step: int) -> None:
        how.add((step, self.app.query_one(PromptInput).cursor_blink))
        await append(self, text, step)

    monkeypatch.setattr(MarkdownBody, "append", seen)
    monkeypatch.setattr(RemoteBackend, "shares_cpu", property(lambda _: False))
    asked = ask_every(monkeypatch)
    with fault_server_thread() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="paced-60-150"))
        app = PhasechatApp(settings=Settings(max_tokens=70), backend=backend)
        async with app.run_test(size=(100, 30)):
            await wait_for(lambda: backend.state == "ready")
            app.chat.send("go")
            await wait_for(lambda: bool(app.turns.exchanges) and not app.chat.generating)
            assert asked == [None]  # as the network brings them
        await backend.aclose()
    assert how == {(STREAM_STEP, True)}


async def test_a_finished_answer_is_frozen_out_of_the_collectors_scans() -> None:
    """Python's full collections walk every object: once an answer is final, what is
    alive moves to the permanent generation (so the pauses do not grow with the chat),
    and a new chat unfreezes it (so the old chat's widgets can be freed)."""
    import gc
    import weakref

    gc.unfreeze()
    with fault_server_thread() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="fastend-300"))
        app = PhasechatApp(settings=Settings(max_tokens=310), backend=backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(lambda: backend.state == "ready")
            await wait_for(lambda: gc.get_freeze_count() > 1000)  # start-up, from the first frame
            at_start = gc.get_freeze_count()
            app.chat.send("go")
            await wait_for(lambda: bool(app.turns.exchanges) and not app.chat.generating)
            # only a finished answer settles the heap: a failed one says why (seen once in
            # CI, under three vLLMs' load, as a 120 s wait for a freeze that never came)
            done = app.turns.exchanges[-1]
            assert done.metrics is not None and done.answer.error is None, done.answer.error
            assert len(app.screen_stack) == 1  # settle_heap skips while a modal is open
            await wait_for(lambda: gc.get_freeze_count() > at_start)  # and the answer
            view = weakref.ref(list(app.query(MessageView))[-1])
            await app.chat.show_conversation(app.workspace.new_chat())
            assert gc.get_freeze_count() == 0
            await pilot.pause(0.2)  # removal finishes after the call returns
            gc.collect()
            assert view() is None  # the old chat's answer was freed
        await backend.aclose()
