"""A concurrency sweep of the current remote backend, drawn as it runs: the table of
levels, then the chart (chat/trips/sweep_chart.py) with the knee marked.

Reached from the command palette ("Concurrency sweep"). It runs chat/trips/sweep.py on the
backend the chat uses (its own one-turn requests; the chat is not touched), at
concurrency 1, 2, 4 and 8 with DEFAULT_MAX_TOKENS per answer, each level DEFAULT_REPEATS
times (more when noisy). Closing the screen stops the sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from phasechat.backends.base import Backend
from phasechat.chat.config.settings import Settings
from phasechat.chat.text import one_line
from phasechat.chat.trips.sweep import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_REPEATS,
    LevelRun,
    SweepResult,
    sweep,
)
from phasechat.chat.trips.sweep_chart import (
    SWEEP_HEADER,
    result_chart,
    sweep_notes,
    sweep_row,
    sweep_table,
)
from phasechat.tui.host import ChatHost

LEVELS = (1, 2, 4, 8)


class SweepScreen(ModalScreen[None]):
    """Runs a sweep (or shows a finished one) and draws its table and chart."""

    DEFAULT_CSS = """
    SweepScreen { align: center middle; }
    SweepScreen > VerticalScroll { width: 108; max-width: 100%; height: 90%;
        background: $surface; border: thick $primary; padding: 0 1; }
    SweepScreen .sweep-state { color: $text-muted; }
    SweepScreen .sweep-table { margin: 1 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Close", id="sweep-close")]

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        levels: Sequence[int] = LEVELS,
        *,
        result: SweepResult | None = None,
        repeats: int = DEFAULT_REPEATS,
    ) -> None:
        """Sweep `backend` at `levels`, each `repeats` times (more when noisy); given a
        finished `result`, only draw it."""
        super().__init__()
        self.backend = backend
        self.settings = settings
        self.levels = tuple(levels)
        self.repeats = repeats
        self.result = result
        self.rows: list[str] = []
        self.previous: LevelRun | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            title = f"Concurrency sweep · {one_line(self.backend.name)}"
            yield Static(Content.assemble((title, "bold"), f" · {one_line(self.backend.model)}"))
            yield Static("", classes="sweep-state")
            yield Static(Content(SWEEP_HEADER), classes="sweep-table")
            yield Static("", classes="sweep-chart")
            yield Static("", classes="sweep-notes")

    def on_mount(self) -> None:
        if self.result is not None:
            self.draw(self.result)
        else:
            levels = ", ".join(map(str, self.levels))
            self.state(f"running: levels {levels}, each {self.repeats} times; Esc stops")
            self.run_sweep()

    def state(self, text: str) -> None:
        self.query_one(".sweep-state", Static).update(Content(text))

    @work(exclusive=True, group="sweep")
    async def run_sweep(self) -> None:
        settings = replace(self.settings, max_tokens=DEFAULT_MAX_TOKENS)
        result = await sweep(
            self.backend, self.levels, settings, on_level=self.level_done, repeats=self.repeats
        )
        self.result = result
        self.draw(result)

    def level_done(self, run: LevelRun) -> None:
        self.rows.append(sweep_row(run, run.step_from(self.previous)))
        self.previous = run
        self.query_one(".sweep-table", Static).update(
            Content("\n".join([SWEEP_HEADER, *self.rows]))
        )
        left = [c for c in self.levels if c > run.level.concurrency]
        if left:
            self.state(f"level {run.level.concurrency} done; running {left[0]}; Esc stops")

    def draw(self, result: SweepResult) -> None:
        """The table, the chart (sized to the screen) and the notes of a finished sweep."""
        self.query_one(".sweep-table", Static).update(Content("\n".join(sweep_table(result))))
        width = max(40, min(90, self.app.size.width - 10))
        chart = result_chart(result, width=width, height=18)
        self.query_one(".sweep-chart", Static).update(Content(chart))
        self.query_one(".sweep-notes", Static).update(Content("\n".join(sweep_notes(result))))
        per = f"{result.per_stream} requests a stream, {result.max_tokens} tokens each"
        self.state(f"done: {len(result.levels)} levels, {per}; Esc closes")

    def on_unmount(self) -> None:
        self.workers.cancel_node(self)

    def action_close(self) -> None:
        self.dismiss(None)


def open_sweep(
    chat: ChatHost, levels: Sequence[int] = LEVELS, repeats: int = DEFAULT_REPEATS
) -> bool:
    """Show the sweep screen for the app's backend; False (with a notice) when it cannot
    run: a local model (one request at a time) or an answer still streaming."""
    backend = chat.backend
    if backend.serial:
        chat.notify("The sweep needs a remote backend: the local model answers one at a time.")
        return False
    if chat.refused_while_answering():
        return False
    chat.app.push_screen(SweepScreen(backend, chat.turns.settings, levels, repeats=repeats))
    return True
