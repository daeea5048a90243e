"""The compare tables and titles with absurd inputs (issue 23 item 7): a ratio B/A of
1,234.5 or a million ran the columns together; a 200-character model id (with markup and
an escape in it) pushed the compare title off its one row."""

from __future__ import annotations

import re
from typing import Any

import pytest
from textual.geometry import Region
from textual.widget import Widget

from phasechat.backends.events import Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import (
    Answer,
    Comparison,
    MetricRow,
    Side,
    compare_metrics,
    fmt_ratio,
    request_for,
)
from phasechat.cli.commands.compare_cli import table_lines
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.recorder import Trace
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.compare_screen import CompareScreen, shortened
from tests.scripted import ScriptedBackend

FIGURES = {
    "backend": "scripted",
    "model": "m",
    "finish": "stop",
    "ttft_ms": 2.0,
    "e2e_ms": 500.0,
    "prompt_tokens": 42,
    "cached_tokens": 30,
    "output_tokens": 64,
    "decode_tok_s": 91.2,
    "prefill_tok_s": 288.0,
    "chars_per_s": 350.0,
}
#: B's figures: TTFT 1,234.5x A's, e2e 2 million times, decode a millionth
ABSURD = {**FIGURES, "ttft_ms": 2469.0, "e2e_ms": 1e9, "decode_tok_s": 91.2e-6}


def rows() -> list[MetricRow]:
    return compare_metrics([metrics_from_dict(FIGURES)], [metrics_from_dict(ABSURD)])


def cells(line: str) -> list[str]:
    """A table line's cells: what two or more spaces part."""
    return re.split(r"\s{2,}", line.strip())


@pytest.mark.parametrize(
    ("ratio", "shown"),
    [
        (2.05, "2.05"),
        (999.994, "999.99"),
        (1234.5, "1,234"),  # banker's rounding: no matter, it is a thousand times
        (999_999.0, "999,999"),
        (2e6, "2.0e+06"),
        (1e300, "1.0e+300"),
        (0.004, "<0.01"),
        (0.0, "0.00"),
        (None, "n/a"),
        (float("inf"), "n/a"),
        (float("nan"), "n/a"),
    ],
)
def test_ratios_are_shown_in_few_characters(ratio: float | None, shown: str) -> None:
    assert fmt_ratio(ratio) == shown


def test_cli_table_keeps_columns_apart_at_any_ratio() -> None:
    lines = table_lines(rows(), repeat=1)
    by_title = {cells(line)[0]: cells(line) for line in lines[1:]}
    assert cells(lines[0]) == ["metric", "A median [min-max]", "B median [min-max]", "B/A"]
    assert by_title["TTFT (ms)"] == ["TTFT (ms)", "2.0", "2,469", "1,234"]
    assert by_title["e2e (ms)"] == ["e2e (ms)", "500", "1,000,000,000", "2.0e+06"]
    assert by_title["decode (tok/s)"][-1] == "<0.01"
    assert all(len(cells(line)) == 4 for line in lines)
    # the columns line up: every line as long as the header, each ratio under "B/A"
    assert {len(line) for line in lines} == {len(lines[0])}
    # a table of ordinary figures is laid out as it always was
    ordinary = table_lines(compare_metrics([metrics_from_dict(FIGURES)] * 2, []), repeat=1)
    head = f"{'metric':<20}{'A median [min-max]':>26}{'B median [min-max]':>26}{'B/A':>8}"
    assert ordinary[0] == head


def drawn(widget: Widget) -> list[str]:
    """The text of each row the widget draws, as the screen shows it."""
    width, height = widget.outer_size
    return [strip.text for strip in widget.render_lines(Region(0, 0, width, height))]


def comparison(a: ScriptedBackend, b: ScriptedBackend, figures_b: dict[str, Any]) -> Comparison:
    c = Comparison(Side("a", a, Settings()), Side("b", b, Settings()), (Message("user", "Hi"),))
    for side, figures in enumerate((FIGURES, figures_b)):
        trace = Trace(backend=c.sides[side].name, model="m")
        trace.text_parts.append("answer")
        request = request_for(Settings(), c.messages)
        c.answers.append(Answer(side, 0, trace, request, metrics_from_dict(figures), True))
    return c


async def test_tui_table_keeps_columns_apart_at_any_ratio() -> None:
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=(110, 34)) as pilot:
        c = comparison(ScriptedBackend("a"), ScriptedBackend("b"), ABSURD)
        await app.push_screen(CompareScreen(c, run=False))
        await pilot.pause()
        table = app.screen.query_one("#compare-table")
        lines = [line.rstrip() for line in drawn(table) if line.strip()]
        assert cells(lines[0]) == ["A", "B", "B-A", "B/A"]
        by_title = {cells(line)[0]: cells(line) for line in lines[1:]}
        assert by_title["TTFT ms"] == ["TTFT ms", "2.0", "2,469", "+2,467", "1,234"]
        assert by_title["e2e ms"][-1] == "2.0e+06"
        assert by_title["decode tok/s"][-1] == "<0.01"
        assert len(by_title) == 7 and all(len(row) == 5 for row in by_title.values())
        # nothing wrapped or cut: one drawn row per metric, the right padding still blank
        assert all(len(line) < table.outer_size.width for line in lines)


class NamedBackend(ScriptedBackend):
    def __init__(self, name: str, model: str) -> None:
        super().__init__(name)
        self._model = model

    @property
    def model(self) -> str:
        return self._model


HOSTILE_ID = "[bold]vendor/" + "x" * 90 + "\x1b[31m" + "y" * 90 + "-Q4_K_M.gguf"


@pytest.mark.parametrize("size", [(110, 34), (70, 30)])
async def test_a_200_character_model_id_is_shortened_and_the_title_kept(
    size: tuple[int, int],
) -> None:
    assert len(HOSTILE_ID) > 200
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=size) as pilot:
        a, b = NamedBackend("server", HOSTILE_ID), NamedBackend("local", "small.gguf")
        await app.push_screen(CompareScreen(comparison(a, b, FIGURES), run=False))
        await pilot.pause()
        title_a = app.screen.query_one("#title-0")
        shown = drawn(title_a)
        assert len(shown) == 1
        line = shown[0].rstrip()
        assert line.startswith("A · a · [bold]vend")  # markup shown as written
        assert line.endswith("Q4_K_M.gguf")  # the end, where ids differ, kept
        assert "…" in line and "\x1b" not in line
        assert len(line) <= title_a.outer_size.width
        assert drawn(app.screen.query_one("#title-1"))[0].strip() == "B · b · small.gguf"


def test_shortened_keeps_start_and_end_in_cells() -> None:
    assert shortened("abcdef", 6) == "abcdef"
    assert shortened("abcdefgh", 5) == "ab…gh"
    assert shortened("漢字漢字漢字", 7) == "漢…漢字"  # wide characters count two cells
    assert shortened("abc", 0) == "…"


async def test_a_long_reason_wraps_under_the_figures_at_80_columns() -> None:
    """Seen in tmux at 80x24: the reason a side failed was cut at the table's edge
    ("... connection refused (is the"). Under the figures it wraps, whole."""
    reason = (
        "openai: cannot connect to http://127.0.0.1:8080/v1: connection refused "
        "(is the server running?)"
    )
    app = PhasechatApp(backend=ScriptedBackend())
    async with app.run_test(size=(80, 24)) as pilot:
        c = comparison(ScriptedBackend("a"), ScriptedBackend("b"), FIGURES)
        screen = CompareScreen(c, run=False)
        await app.push_screen(screen)
        screen.error = reason
        screen.refresh_figures()
        await pilot.pause()
        said = screen.query_one("#compare-error")
        rows = [line.strip() for line in drawn(said) if line.strip()]
        assert len(rows) >= 2 and " ".join(rows) == reason
        assert said.region.bottom <= screen.query_one("Footer").region.y  # above the keys
        assert reason not in " ".join(drawn(screen.query_one("#compare-table")))
