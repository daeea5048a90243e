"""What each part of the prompt is worth, for the chat on screen: its last turn run again
without each section (chat/trips/ablate.py), cold, and the table of what each removal
changed. A side trip: nothing is added to the chat; the engine's cache moves, and the
screen says so."""

from __future__ import annotations

from collections.abc import Sequence

from textual import work
from textual.content import Content
from textual.css.query import NoMatches
from textual.widgets import Static

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.ablate import (
    Ablation,
    Variant,
    ablation_title,
    is_long,
    plan_line,
    report_lines,
)
from phasechat.telemetry.forecast import Rates
from phasechat.telemetry.metrics import Metrics
from phasechat.tui.screens.report_screen import ReportScreen

REPEAT = 3


class AblateScreen(ReportScreen):
    """Runs the ablation when shown; Esc stops it and goes back."""

    def __init__(self, ablation: Ablation, plan: str, long: bool = False) -> None:
        super().__init__()
        self.ablation, self.plan = ablation, plan  # plan: chat/trips/ablate.plan_line
        self.runs = 0
        self.total = ablation.runs(REPEAT)
        self.long = long  # whether to ask before starting (`planned`)

    @classmethod
    def planned(
        cls, backend: Backend, settings: Settings, messages: Sequence[Message], rates: Rates
    ) -> AblateScreen | None:
        """The screen for `messages`'s ablation, with its count and estimate at `rates`
        (`long`: ask first, as `phasechat ablate` does); None: nothing to remove."""
        ablation = Ablation(backend, settings, messages)
        if len(ablation.variants) == 1:
            return None
        estimate = ablation.estimate_ms(REPEAT, rates)
        plan = plan_line(ablation, REPEAT, estimate)
        return cls(ablation, plan, is_long(ablation.runs(REPEAT), estimate))

    def head(self) -> Content:
        return Content.assemble(
            ("What each part of the prompt is worth", "bold"),
            f"   {ablation_title(self.ablation, REPEAT)}\n",
            ("A side trip: nothing is added to the chat. Esc stops.", "dim"),
        )

    def body(self) -> Content:
        return Content(f"{self.plan}\nrun 0/{self.total}…")

    def on_mount(self) -> None:
        self.run_ablation()

    @work(exclusive=True, group="ablate")
    async def run_ablation(self) -> None:
        table = self.query_one("#text", Static)

        def progress(_variant: Variant, _metrics: Metrics) -> None:
            self.runs += 1
            table.update(Content(f"{self.plan}\nrun {self.runs}/{self.total}…"))

        try:
            await self.ablation.run(REPEAT, progress)
        except RuntimeError as exc:
            table.update(Content.styled(f"stopped: {exc}", "$error"))
            return
        try:
            head = self.query_one("#head", Static)
        except NoMatches:  # Esc came as the last run ended: the screen is being taken down
            return
        head.update(self.head())  # the prompt's tokens now known
        table.update(Content("\n".join(report_lines(self.ablation))))
