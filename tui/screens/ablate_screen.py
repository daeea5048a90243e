"""What each part of the prompt is worth, for the chat on screen: its last turn run again
without each section (chat/trips/ablate.py), cold, and the table of what each removal
changed. A side trip: nothing is added to the chat; the engine's cache moves, and the
screen says so."""

from __future__ import annotations

from textual import work
from textual.content import Content
from textual.widgets import Static

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.ablate import Ablation, Variant, ablation_title, report_lines
from phasechat.telemetry.metrics import Metrics
from phasechat.tui.screens.report_screen import ReportScreen

REPEAT = 3


class AblateScreen(ReportScreen):
    """Runs the ablation when shown; Esc stops it and goes back."""

    def __init__(self, backend: Backend, settings: Settings, messages: tuple[Message, ...]) -> None:
        super().__init__()
        self.ablation = Ablation(backend, settings, messages)
        self.runs = 0
        self.total = len(self.ablation.variants) * REPEAT

    def head(self) -> Content:
        return Content.assemble(
            ("What each part of the prompt is worth", "bold"),
            f"   {ablation_title(self.ablation, REPEAT)}\n",
            ("A side trip: nothing is added to the chat. Esc stops.", "dim"),
        )

    def body(self) -> Content:
        return Content(f"run 0/{self.total}…")

    def on_mount(self) -> None:
        self.run_ablation()

    @work(exclusive=True, group="ablate")
    async def run_ablation(self) -> None:
        table = self.query_one("#text", Static)

        def progress(_variant: Variant, _metrics: Metrics) -> None:
            self.runs += 1
            table.update(Content(f"run {self.runs}/{self.total}…"))

        try:
            await self.ablation.run(REPEAT, progress)
        except RuntimeError as exc:
            table.update(Content.styled(f"stopped: {exc}", "$error"))
            return
        self.query_one("#head", Static).update(self.head())  # the prompt's tokens now known
        table.update(Content("\n".join(report_lines(self.ablation))))
