"""The compare view: the last prompt replayed on two backends, the answers side by side
as they stream, a table of their figures with the deltas, and the figures as bars.

It draws a `Comparison` (chat/compare.py) and, when asked, runs it; the chat behind it is
never touched: the replay is a side trip, and says so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import ClassVar

from rich.cells import cell_len
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from phasechat.backends.base import Backend
from phasechat.chat.text import one_line
from phasechat.chat.trips.compare import (
    Answer,
    Comparison,
    MetricRow,
    Side,
    aligned,
    compare_metrics,
    fmt_cell,
    fmt_ratio,
)
from phasechat.chat.trips.forced_sides import reader_of
from phasechat.chat.trips.kv_cost import kv_bytes_per_token, kv_text
from phasechat.chat.turns import InputError
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.tui.screens.divergence_view import DivergenceView
from phasechat.tui.widgets.chat_log import SHARED_HZ  # the chat's rate beside an engine on this CPU
from phasechat.tui.widgets.clip import clipped_text

REFRESH_HZ = 10
SIDE_TRIP = "A side trip: nothing here is added to the chat or saved. Esc goes back."
CACHE_MOVED = (
    "the engine's cache now holds the last run, not the chat: "
    "the forecast line says what the next turn reads again"
)


#: The fewest cells a model id is shortened to: below that the title's end is cut.
MODEL_MIN_CELLS = 12


def shortened(text: str, width: int) -> str:
    """`text` in at most `width` cells: one too long keeps its start and its end (where
    model ids differ: the size, the quantization) with "…" between."""
    if cell_len(text) <= width:
        return text
    room = max(width - 1, 0)
    head = _fit(text, (room + 1) // 2)
    tail = _fit(reversed(text), room - cell_len(head))[::-1]
    return f"{head}…{tail}"


def _fit(chars: Iterable[str], width: int) -> str:
    """The first of `chars` that fit in `width` cells."""
    out, used = [], 0
    for ch in chars:
        used += cell_len(ch)
        if used > width:
            break
        out.append(ch)
    return "".join(out)


def side_title(n: int, side: Side, width: int | None = None) -> Content:
    """ "A · name · model", as plain text; in `width` cells, a model id too long for it
    is shortened in the middle, so the side's letter and name always show."""
    head = f"{'AB'[n]} · {one_line(side.name)} · "
    model = one_line(side.backend.model)
    if width is not None:
        model = shortened(model, max(width - cell_len(head), MODEL_MIN_CELLS))
    return Content(head + model)


class SideTitle(Static):
    """A side's title, fitted to the width it is given (a server's model id can be any
    length: 200 characters wrapped onto a second line the title's one row cut off)."""

    def __init__(self, n: int, side: Side, *, id: str) -> None:
        super().__init__(classes="compare-title", id=id)
        self.n, self.side = n, side
        self._model = side.backend.model

    def render(self) -> Content:
        return side_title(self.n, self.side, self.content_size.width)

    def check_model(self) -> None:
        """Redraw if the backend now names another model (it does once it has loaded)."""
        if self.side.backend.model != self._model:
            self._model = self.side.backend.model
            self.refresh()


def figures(answer: Answer | None, now_ns: int) -> Metrics | None:
    """An answer's final metrics, or its live ones while it streams."""
    if answer is None:
        return None
    if answer.metrics is not None:
        return answer.metrics
    return compute(answer.trace, now_ns) if answer.started and answer.trace.t_sent else None


def table(rows: Sequence[MetricRow]) -> Content:
    """metric | A | B | B-A | B/A, one line each; unknown figures are "n/a". The columns
    are as wide as their widest cell needs (#compare-table's width is auto)."""
    cells = [["", "A", "B", "B-A", "B/A"]]
    for row in rows:
        unit = "" if row.unit in ("%", "chars/s") else f" {row.unit}"
        delta = row.delta
        shown = "n/a" if delta is None else ("+" if delta > 0 else "") + fmt_cell(delta, row.unit)
        a, b = fmt_cell(row.a.median, row.unit), fmt_cell(row.b.median, row.unit)
        cells.append([row.title + unit, a, b, shown, fmt_ratio(row.ratio)])
    head, *lines = aligned(cells, (16, 10, 10, 10, 7))
    return Content.assemble((head, "bold"), *(f"\n{line}" for line in lines), "\n")


#: The bars' colours, A then B (plotext's names).
BAR_COLORS = ("cyan", "orange")


def draw_bars(plot: PlotextPlot, rows: Sequence[MetricRow]) -> None:
    """Each metric's A and B as bars, the larger of the two = 100 (the table has the
    values). A figure unknown on either side draws no bar and says "n/a" (never a 0).

    One bar per text row: the chart needs 4 rows more than two per metric (title,
    frame, axis); the y range is pinned to the bars so plotext puts each on its label's
    row."""
    plt = plot.plt
    plt.clear_data()
    plt.clear_figure()
    plt.title("each metric: % of the larger side")
    labels: list[str] = []
    n = 2 * len(rows)
    for i, r in enumerate(rows):
        a, b = r.a.median, r.b.median
        known = a is not None and b is not None
        top = max(a or 0.0, b or 0.0) or 1.0
        for side, value in enumerate((a, b)):
            labels.append(f"{r.title} {'AB'[side]}{'' if known else ' n/a'}")
            # the first metric on top: plotext counts y upwards
            y = n - (2 * i + side)
            pct = round(100 * value / top) if known and value is not None else 0
            plt.bar([y], [pct], orientation="horizontal", width=0.6, color=BAR_COLORS[side])
    plt.yticks(list(range(n, 0, -1)), labels)
    plt.xlim(0, 100)
    plt.ylim(1, max(n, 2))
    plot.refresh()


class CompareScreen(Screen[None]):
    """The last prompt on A and B, side by side."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="compare-back"),
        Binding("n", "run_each", "Run each again", id="compare-run-each"),
        Binding("d", "divergence", "Divergence", id="compare-divergence"),
    ]

    def __init__(
        self,
        comparison: Comparison,
        owned: Sequence[Backend] = (),
        *,
        run: bool = True,
        heading: Content | None = None,
        rerun: int = 0,
    ) -> None:
        """`owned`: backends built for this comparison only, closed when it is closed;
        `run=False` only draws the comparison's answers (recorded ones, or snapshots);
        `heading` replaces the replay's; `rerun`: N offers "run each N times" (cold, the
        recorded answers then set aside)."""
        super().__init__()
        self.comparison = comparison
        self.owned = list(owned)
        self.run_it = run
        self.heading = heading
        self.rerun = rerun
        self.error = ""
        self._texts = ["", ""]
        self._bars: tuple[tuple[float | None, float | None], ...] | None = None

    def compose(self) -> ComposeResult:
        c = self.comparison
        order = "streaming together" if c.together else "one after the other"
        head = self.heading or Content.assemble(
            ("The last prompt compared", "bold"),
            f" on two backends, {order}\n",
            (SIDE_TRIP, "dim"),
        )
        yield Static(head, id="compare-head")
        with Horizontal(id="compare-answers"):
            for n, side in enumerate(c.sides):
                with Vertical(classes="compare-side"):
                    yield SideTitle(n, side, id=f"title-{n}")
                    with VerticalScroll():
                        yield Static(Content(""), id=f"compare-text-{n}")
        with Horizontal(id="compare-figures"):
            yield Static(id="compare-table")
            yield PlotextPlot(id="compare-bars")
        # under the figures, the screen's width: a long reason wraps, never cut off
        yield Static(id="compare-error")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_figures()
        shared = any(side.backend.shares_cpu for side in self.comparison.sides)
        self.set_interval(1 / (SHARED_HZ if shared else REFRESH_HZ), self.refresh_figures)
        if self.run_it:
            self.run_comparison()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run_each":
            return self.rerun > 0
        if action == "divergence":  # each side's distributions can be read here or there
            return all(reader_of(side.backend) is not None for side in self.comparison.sides)
        return True

    def action_divergence(self) -> None:
        """B's divergence from A over A's newest answer, teacher-forced, in a view."""
        c = self.comparison
        answer = c.latest(0)
        if answer is None or not answer.complete or not answer.text:
            self.notify("A has no finished answer to read yet", severity="warning")
            return
        ra, rb = (reader_of(side.backend) for side in c.sides)
        if ra is None or rb is None:
            return
        a, b = c.sides
        title = f"B ({one_line(b.name)}) against A ({one_line(a.name)}) over A's answer"
        view = DivergenceView(
            title,
            (a.backend, b.backend),
            (ra, rb),
            answer.request.messages,
            (answer.text, answer.trace.answer_tokens),
        )
        self.app.push_screen(view)

    def action_run_each(self) -> None:
        """Run each side `rerun` times, cold, as `phasechat compare` does: the table
        then shows the medians (the recorded answers, measured warm, are set aside)."""
        if any(not a.done for a in self.comparison.answers):
            self.notify("still running", severity="warning")
            return
        self.comparison.answers.clear()
        self.comparison.repeat = 0
        self.run_comparison(self.rerun)

    @work(exclusive=True, group="compare")
    async def run_comparison(self, repeat: int = 1) -> None:
        for backend in {id(s.backend): s.backend for s in self.comparison.sides}.values():
            if backend.state in ("idle", "failed"):
                await backend.start()
            if backend.state != "ready":
                self.error = f"{backend.name}: {backend.state_detail}"
                return
        try:
            await self.comparison.run(repeat)
            if self.rerun:  # cold runs moved the engine's cache off the chat
                self.notify(CACHE_MOVED, markup=False)
        except InputError as exc:
            self.error = str(exc)
        finally:
            with contextlib.suppress(NoMatches):  # closed while it ran: nothing to draw
                self.refresh_figures()
                self.refresh_bindings()  # a server's family is known once it is started

    def refresh_figures(self) -> None:
        """Move new text in and redraw the table and the bars (REFRESH_HZ, or SHARED_HZ
        beside an engine on this CPU); a part that did not change is not redrawn."""
        c, now = self.comparison, time.perf_counter_ns()
        sides = []
        for n in (0, 1):
            answer = c.latest(n)
            text = answer.text if answer is not None else ""
            if answer is not None and answer.trace.error is not None:
                text += f"\n\n[error] {answer.trace.error.message}"
            elif answer is not None and not answer.done:
                text += " ▍" if answer.started else "(waiting for the other side)"
            if text != self._texts[n]:
                self._texts[n] = text
                drawn = clipped_text(text)  # a 1 MB answer: its start and end
                self.query_one(f"#compare-text-{n}", Static).update(drawn)
            self.query_one(f"#title-{n}", SideTitle).check_model()
            sides.append(figures(answer, now))
        a, b = sides
        if c.repeat > 1 and all(x.done for x in c.answers):  # N runs: their medians
            rows = c.rows()
        else:
            rows = compare_metrics([a] if a else [], [b] if b else [])
        body = table(rows)
        if any(kv_bytes_per_token(side.backend) is not None for side in c.sides):
            kv = [f"{'AB'[n]} {kv_text(side.backend, sides[n])}" for n, side in enumerate(c.sides)]
            body = Content.assemble(body, "\n".join(kv), "\n")
        self.query_one("#compare-table", Static).update(body)
        said = self.query_one("#compare-error", Static)
        said.display = bool(self.error)
        said.update(one_line(self.error))
        shown = tuple((r.a.median, r.b.median) for r in rows)
        if shown != self._bars:  # plotext builds the whole chart: only when it changed
            self._bars = shown
            # the timings and rates as bars (output tokens: the table's), one per text row
            draw_bars(self.query_one(PlotextPlot), [r for r in rows if r.key != "output_tokens"])

    def action_back(self) -> None:
        self.workers.cancel_group(self, "compare")
        self.dismiss(None)

    async def on_unmount(self) -> None:
        for backend in self.owned:
            await backend.aclose()
