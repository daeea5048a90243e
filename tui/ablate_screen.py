"""What each part of the prompt is worth, for the chat on screen: its last turn run again
without each section (chat/trips/ablate.py), cold, and the table of what each removal
changed. A side trip: nothing is added to the chat; the engine's cache moves, and the
screen says so."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from phasechat.backends.base import Backend
from phasechat.backends.events import Message
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.ablate import Ablation, Variant, ablation_title, report_lines
from phasechat.telemetry.metrics import Metrics

REPEAT = 3


class AblateScreen(ModalScreen[None]):
    """Runs the ablation when shown; Esc stops it and goes back."""

    DEFAULT_CSS = """
    AblateScreen { align: center middle; }
    AblateScreen > #box { width: 98%; height: 80%; background: $surface; border: thick $primary; }
    AblateScreen #table { padding: 1 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close", id="ablate-close"),
    ]

    def __init__(self, backend: Backend, settings: Settings, messages: tuple[Message, ...]) -> None:
        super().__init__()
        self.ablation = Ablation(backend, settings, messages)
        self.runs = 0

    def compose(self) -> ComposeResult:
        total = len(self.ablation.variants) * REPEAT
        with Vertical(id="box"):
            yield Static(
                Content.assemble(
                    ("What each part of the prompt is worth", "bold"),
                    f"   {ablation_title(self.ablation, REPEAT)}",
                ),
                id="title",
            )
            with VerticalScroll():
                yield Static(Content(f"run 0/{total}…"), id="table")
            yield Static(
                Content.styled("A side trip: nothing is added to the chat. Esc stops.", "dim")
            )
            yield Footer()

    def on_mount(self) -> None:
        self.run_ablation()

    @work(exclusive=True, group="ablate")
    async def run_ablation(self) -> None:
        total = len(self.ablation.variants) * REPEAT
        table = self.query_one("#table", Static)

        def progress(_variant: Variant, _metrics: Metrics) -> None:
            self.runs += 1
            table.update(Content(f"run {self.runs}/{total}…"))

        try:
            await self.ablation.run(REPEAT, progress)
        except RuntimeError as exc:
            table.update(Content.styled(f"stopped: {exc}", "$error"))
            return
        self.query_one("#title", Static).update(
            Content.assemble(
                ("What each part of the prompt is worth", "bold"),
                f"   {ablation_title(self.ablation, REPEAT)}",
            )
        )
        table.update(Content("\n".join(report_lines(self.ablation))))
