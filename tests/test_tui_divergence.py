"""Issue 39, items 2 and 4: the replay picker offers the KV types, the compare view shows
each side's KV cost, and from it `d` opens the divergence of B from A over A's answer,
shaded token by token, measured in a worker that Esc stops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare_targets import variants
from phasechat.telemetry.divergence import compare_logits
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import CompareScreen
from phasechat.tui.screens.divergence_view import (
    FIRST_MARK,
    DivergenceView,
    kl_shade,
    shaded_answer,
    summary_line,
    token_texts,
)
from phasechat.tui.screens.timeline_view import SHADE_COLOURS
from tests.helpers import wait_for
from tests.test_tui_compare import pick


def test_each_kl_falls_in_its_tenfold_shade() -> None:
    # a bound belongs to the shade above it: 1e-4 is not "below 1e-4"
    kls = (0.0, 5e-5, 1e-4, 9.9e-4, 0.05, 0.1, 7.0)
    assert [kl_shade(k) for k in kls] == [0, 0, 1, 1, 3, 4, 4]


def test_a_character_split_over_two_tokens_is_the_second_tokens_text() -> None:
    # "é" is b"\xc3\xa9": decoded one piece at a time it would be two U+FFFD
    assert token_texts([b"caf", b"\xc3", b"\xa9", b"!"]) == ["caf", "", "é", "!"]
    assert token_texts([b"ok", b"\xc3"]) == ["ok", "\ufffd"]  # a cut-off end is shown


def test_the_first_divergence_is_marked_and_disagreements_underlined() -> None:
    ref = np.array([[3.0, 0.0, 0.0], [3.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    other = ref.copy()
    other[1] = [1.0, 3.0, 0.0]  # the top choice swapped at the second token
    d = compare_logits(ref, other)
    content = shaded_answer([b"The", b" sea", b" rose"], d)
    assert content.plain == f"The{FIRST_MARK} sea rose"
    styles = {content.plain[s.start : s.end]: str(s.style) for s in content.spans}
    assert styles["The"] == f"on {SHADE_COLOURS[0]}"  # identical rows: KL exactly 0
    assert (
        "underline" in styles[" sea"] and f"on {SHADE_COLOURS[kl_shade(d.kl[1])]}" in styles[" sea"]
    )
    # the rows share their normaliser, so log p - log q is the logits' difference
    # (2, -2, 0): KL = 2 (p0 - p1) = 2 (e^3 - e^1) / (e^3 + e^1 + 1) = 1.4592 nats
    assert d.kl[1] == pytest.approx(2 * (np.e**3 - np.e) / (np.e**3 + np.e + 1))
    assert kl_shade(d.kl[1]) == 4
    line = summary_line(d).plain
    # the mean over 3 tokens 0.4864; p99 between the sorted 0 and 1.4592 at 0.98: 1.4300
    assert "KL mean 0.4864, p99 1.4300, max 1.4592 at token 2" in line
    assert "first divergence token 2" in line
    assert "top-1 agreement 66.7%" in line


def test_the_picker_offers_each_other_kv_type() -> None:
    offered = variants(BackendSpec("local"), Settings())
    assert {"kv": "q8_0"} in offered and {"kv": "q4_0"} in offered
    assert {"kv": "f16"} not in offered  # the active setting is not a variant of itself


async def compared(pilot: Pilot[None], question: str, variant: str) -> CompareScreen:
    """Send `question`, then replay it on `variant` from F5 and wait for both answers."""
    app = pilot.app
    assert isinstance(app, PhasechatApp)
    await wait_for(pilot, lambda: app.backend.state == "ready")
    app.chat.send(question)
    await wait_for(pilot, lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
    await pilot.press("f5")
    await pick(pilot, variant)
    screen = app.screen
    assert isinstance(screen, CompareScreen)
    c = screen.comparison
    await wait_for(pilot, lambda: all(len(c.of(n)) == 1 and c.of(n)[0].done for n in (0, 1)))
    return screen


@pytest.mark.model
async def test_d_on_the_compare_view_shades_the_answer_by_its_kl(
    local_backend: LocalBackend,
) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=16, temperature=0), backend=local_backend)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await compared(pilot, "Name three colours of the sea.", "local(kv=q4_0)")
        c = screen.comparison
        # each side's KV: 23,040 bytes a token at f16, 18/64 of it at q4_0
        table = ""

        def kv_drawn() -> bool:
            nonlocal table
            table = str(screen.query_one("#compare-table", Static).render())
            return "KV 23,040 B/token" in table and "KV 6,480 B/token" in table

        await wait_for(pilot, kv_drawn)
        assert "MiB held" in table and "n/a MiB" not in table

        await pilot.press("d")
        view = app.screen
        assert isinstance(view, DivergenceView)
        await wait_for(pilot, lambda: view.divergence is not None)
        d = view.divergence
        assert d is not None
        answer = c.of(0)[0].trace.answer_tokens
        assert answer is not None and d.positions == len(answer.ids)
        assert d.kl_mean > 0  # a q4_0 cache moves the distributions
        await pilot.pause()
        head = str(view.query_one("#head", Static).render())
        assert "KL mean" in head and "top-1 agreement" in head and "floor" not in head
        # f: the engine's floor, A against itself read a token a step, over the same tokens
        await pilot.press("f")
        await wait_for(pilot, lambda: view.floor is not None)
        assert view.floor is not None and view.floor.positions == d.positions
        assert view.floor.top1_agreement >= 0.9 and view.check_action("floor", ()) is False
        await pilot.pause()
        head = str(view.query_one("#head", Static).render())
        assert "floor, A against itself read a token a step: KL mean" in head
        await pilot.press("escape")
        assert isinstance(app.screen, CompareScreen)


@pytest.mark.model
async def test_esc_stops_the_teacher_forcing_and_leaves_the_view(
    local_backend: LocalBackend,
) -> None:
    app = PhasechatApp(settings=Settings(max_tokens=8, temperature=0), backend=local_backend)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await compared(pilot, "Say one word.", "local(kv=q8_0)")
        await pilot.press("d")
        view = app.screen
        assert isinstance(view, DivergenceView)
        await pilot.press("escape")
        # the worker thread is told to stop at its next batch; the view is gone at once
        assert app.screen is screen and view.stop.is_set()
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)


@pytest.mark.parametrize("other", ["moved.gguf", "gone.gguf"])
async def test_the_view_says_why_it_measures_nothing(tmp_path: Path, other: str) -> None:
    """Another vocabulary, or a model file gone since it loaded: a line that says so,
    the answer's text unshaded, the app still there."""
    from phasechat.backends.events import AnswerTokens
    from phasechat.backends.local.teacher import EngineSetting
    from phasechat.chat.trips.forced_sides import Forced, Reader
    from tests.scripted import ScriptedBackend
    from tests.test_engine_variants import tiny_gguf

    a = tiny_gguf(tmp_path / "a.gguf", ["<s>", "a", "bc"])
    tiny_gguf(tmp_path / "moved.gguf", ["<s>", "ab", "c"])
    readers = (
        Reader("A", forced=Forced(a, EngineSetting())),
        Reader("B", forced=Forced(tmp_path / other, EngineSetting())),
    )
    sides = ScriptedBackend("local"), ScriptedBackend("local")
    app = PhasechatApp(settings=Settings(), backend=sides[0])
    async with app.run_test(size=(100, 30)) as pilot:
        tokens = AnswerTokens((1, 2), (b"a", b"bc"), "a.gguf")
        view = DivergenceView("B against A", sides, readers, (), ("abc", tokens))
        await app.push_screen(view)
        await wait_for(pilot, lambda: view.status.startswith("no divergence"))
        await pilot.pause()
        head = str(view.query_one("#head", Static).render())
        expected = "vocabularies differ" if other == "moved.gguf" else "model file not found"
        assert expected in head and view.divergence is None
        assert str(view.query_one("#text", Static).render()) == "abc"
