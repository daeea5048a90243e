"""SVG snapshots of what a person sees: a saved chat in each theme, the switch screen and
the compare view.

Rendered from a saved conversation with fixed metrics (live timings would differ on
every run). Update after an intended change with `pytest --snapshot-update`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote import probe
from phasechat.backends.remote.backend import RemoteConfig
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.engine_held import Held, anatomy_of
from phasechat.chat.trips.compare import Answer, Comparison, Side, request_for
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.recorder import Trace
from phasechat.themes import BUILTIN_THEMES
from phasechat.tui.app import PhasechatApp
from phasechat.tui.chat_screen import ChatScreen
from phasechat.tui.screens.compare_screen import CompareScreen
from phasechat.tui.screens.switch_screen import BackendsScreen
from phasechat.tui.widgets.chat_widgets import PromptInput
from tests.helpers import wait_for
from tests.scripted import ScriptedBackend

METRICS = {
    "backend": "local",
    "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "finish": "stop",
    "ttft_ms": 123.4,
    "e2e_ms": 987.6,
    "prompt_tokens": 42,
    "cached_tokens": 30,
    "output_tokens": 64,
    "decode_tok_s": 91.2,
    "prefill_tok_s": 288.0,
}


def conversation() -> Conversation:
    c = Conversation(system="You are terse.")
    c.add(ChatMessage("user", "What is prefill?"))
    c.add(
        ChatMessage(
            "assistant",
            "**Prefill** reads the whole prompt in one pass.\n\n- compute-bound\n- sets TTFT\n\n"
            "## Measure it\n\n```python\nttft = prompt_tokens / prefill_tok_s\n```\n\n"
            "Run `phasechat bench`, see [the README](https://example.com/readme).\n\n"
            "Model text stays text: [bold red]not markup[/] \x1b[31mno escape\x1b[0m",
            backend="local",
            model="SmolLM2-135M-Instruct.Q4_1.gguf",
            metrics=metrics_from_dict(METRICS),
        )
    )
    c.add(ChatMessage("user", "And decode?"))
    c.add(
        ChatMessage(
            "assistant",
            "One token per forward pass.",
            backend="openai",
            model="remote-model",
            status="cancelled",
            metrics=metrics_from_dict(
                {**METRICS, "backend": "openai", "finish": "cancelled", "output_tokens": 7}
            ),
        )
    )
    return c


class SteadyChat(ChatScreen):
    """The chat with a cursor that does not blink: a picture taken mid-blink differs."""

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one(PromptInput).cursor_blink = False


class SteadyApp(PhasechatApp):
    """The app drawing a `SteadyChat`."""

    def get_default_screen(self) -> ChatScreen:
        self.chat = SteadyChat(self.workspace)
        return self.chat


def make_app() -> PhasechatApp:
    remote = BackendSpec("openai", remote=RemoteConfig(base_url="http://127.0.0.1:9/v1"))
    return SteadyApp(settings=Settings(), backend=ScriptedBackend("local"), profiles=[remote])


@pytest.mark.parametrize("theme", [t.name for t in BUILTIN_THEMES])
def test_saved_chat_in_each_theme(snap_compare: Any, theme: str) -> None:
    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, PhasechatApp)
        app.theme = theme
        await app.chat.show_conversation(conversation())
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(100, 34), run_before=show)


def branched() -> Conversation:
    """A question answered twice (a retry), showing the first answer of the two."""
    c = Conversation(system="You are terse.")
    question = c.add(ChatMessage("user", "What is prefill?"))
    first = c.add(
        ChatMessage(
            "assistant",
            "Prefill reads the whole prompt in one pass.",
            backend="local",
            model="SmolLM2-135M-Instruct.Q4_1.gguf",
            metrics=metrics_from_dict(METRICS),
        )
    )
    c.rewind(question.id)
    c.add(
        ChatMessage(
            "assistant",
            "The compute-bound pass before the first token.",
            backend="local",
            model="SmolLM2-135M-Instruct.Q4_1.gguf",
            metrics=metrics_from_dict({**METRICS, "ttft_ms": 98.1}),
        )
    )
    c.select(first.id)
    return c


def test_a_message_with_a_sibling_shows_which_of_them_it_is(snap_compare: Any) -> None:
    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, PhasechatApp)
        app.turns.replace_conversation(branched())
        await app.chat.show_conversation(app.turns.conversation)
        await pilot.press("ctrl+up")  # the answer, selected: ←/→ would switch
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(100, 24), run_before=show)


def test_switch_screen_shows_the_cost(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the usual ports left out: what runs on this machine is not part of the picture
    monkeypatch.setattr(probe, "USUAL_PORTS", {})

    async def open_switcher(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, PhasechatApp)
        await app.chat.show_conversation(conversation())
        await pilot.press("ctrl+b")
        screen = app.screen
        assert isinstance(screen, BackendsScreen)
        await wait_for(pilot, lambda: screen.found is not None)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=open_switcher)


def fixed_comparison() -> Comparison:
    """Local against a server, one finished answer each, with fixed metrics."""
    c = Comparison(
        Side("local", ScriptedBackend("local"), Settings()),
        Side("server", ScriptedBackend("server"), Settings()),
        (Message("user", "What is prefill?"),),
    )
    answers = (
        ("Prefill reads the whole prompt in one pass: [bold red]not markup[/]", METRICS),
        (
            "It is the compute-bound pass that sets TTFT.\x1b[31m",
            {
                **METRICS,
                "backend": "server",
                "model": "remote-model",
                "ttft_ms": 61.7,
                "e2e_ms": 650.2,
                "cached_tokens": None,  # a server that hides its cache: prefill n/a
                "decode_tok_s": 120.5,
                "prefill_tok_s": None,
                "chars_per_s": 455.0,
            },
        ),
    )
    for side, (text, metrics) in enumerate(answers):
        trace = Trace(backend=c.sides[side].name, model="m")
        trace.text_parts.append(text)
        request = request_for(Settings(), c.messages)
        fixed = metrics_from_dict({**metrics, "chars_per_s": metrics.get("chars_per_s", 350.0)})
        c.answers.append(Answer(side, 0, trace, request, fixed, started=True))
    return c


def test_compare_view_with_fixed_metrics(snap_compare: Any) -> None:
    async def open_compare(pilot: Pilot[None]) -> None:
        await pilot.app.push_screen(CompareScreen(fixed_comparison(), run=False))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(110, 34), run_before=open_compare)


def edited_chat(backend: LocalBackend) -> Conversation:
    """A chat whose second question was edited: its answer's prompt as the bundled model
    reads it, the engine having held the first wording (fixed metrics, exact sections)."""
    system, q1, a1 = "You are terse.", "What is prefill?", "Reading the whole prompt at once."
    old = (Message("system", system), Message("user", q1), Message("assistant", a1))
    sent = (*old, Message("user", "And decode, in one line?"))
    rendered = asyncio.run(backend.render(sent))
    held = asyncio.run(backend.render((*old, Message("user", "And decode?"))))
    assert rendered is not None and held is not None
    cached = next(
        i for i, (a, b) in enumerate(zip(held.pieces, rendered.pieces, strict=False)) if a != b
    )
    metrics = metrics_from_dict(
        {
            **METRICS,
            "prompt_tokens": len(rendered.pieces),
            "cached_tokens": cached,
            "evaluated_prompt_tokens": len(rendered.pieces) - cached,
        }
    )
    c = Conversation(system=system)
    for m in sent[1:]:
        c.add(ChatMessage(m.role, m.content))
    answer = c.add(ChatMessage("assistant", "One token per pass.", backend="local"))
    answer.metrics = metrics
    answer.anatomy = anatomy_of(sent, rendered, metrics, Held(held.text, len(held.pieces)))
    return c


@pytest.mark.model
def test_the_prompt_view_shows_sections_and_where_the_cache_ended(
    snap_compare: Any, local_backend: LocalBackend
) -> None:
    chat = edited_chat(local_backend)

    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, PhasechatApp)
        app.turns.replace_conversation(chat)
        await app.chat.show_conversation(app.turns.conversation)
        await pilot.press("f8")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(100, 40), run_before=show)


def test_the_first_screen_teaches_until_the_first_answer(
    snap_compare: Any, local_backend: LocalBackend
) -> None:
    app = SteadyApp(settings=Settings(), backend=local_backend)
    assert snap_compare(app, terminal_size=(110, 36))


def test_the_divergence_view_shades_each_token_by_its_kl(snap_compare: Any) -> None:
    """B against A over A's answer, from fixed logits: KL 0 where both agree exactly, a
    tenfold shade more for each tenfold KL, the first swapped top choice marked."""
    import numpy as np

    from phasechat.backends.local.teacher import EngineSetting
    from phasechat.chat.trips.forced_sides import Forced, Reader, Teaching
    from phasechat.telemetry.divergence import compare_logits
    from phasechat.tui.screens.divergence_view import DivergenceView

    pieces = (b"Prefill", b" reads", b" the", b" prompt", b" in", b" one", b" pass", b".")
    ref = np.zeros((len(pieces), 4))
    ref[:, 0] = 4.0
    other = ref.copy()
    for i, shift in ((2, 0.01), (3, 0.15), (4, 0.5), (5, 1.5), (6, 5.0)):
        other[i, 1] += shift  # a larger shift: a larger KL, the last one a swapped top
    d = compare_logits(ref, other)
    readers = (
        Reader("llama.cpp here", forced=Forced(Path("a.gguf"), EngineSetting())),
        Reader("llama.cpp here", forced=Forced(Path("a.gguf"), EngineSetting("q4_0"))),
    )
    sides = ScriptedBackend("local"), ScriptedBackend("local")
    view = DivergenceView(
        "B (local(kv=q4_0)) against A (local) over A's answer",
        sides,
        readers,
        (Message("user", "What is prefill?"),),
        (b"".join(pieces).decode(), None),
        measured=(Teaching((1,), tuple(range(len(pieces))), pieces), d),
    )

    async def open_view(pilot: Pilot[None]) -> None:
        await pilot.app.push_screen(view)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(110, 24), run_before=open_view)
