"""Every answer of the session in one table, to compare prompt variants side by side."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from phasechat.chat.config.paths import exports_dir
from phasechat.chat.store.export_files import export_folder, write_export
from phasechat.chat.text import visible_controls
from phasechat.chat.turns import Exchange
from phasechat.telemetry.records import to_csv, to_jsonl
from phasechat.tui.widgets.telemetry_view import fmt

COLUMNS = (
    "#",
    "backend",
    "prompt",
    "prompt tok",
    "cached",
    "TTFT ms",
    "prefill tok/s",
    "decode tok/s",
    "ITL p50",
    "ITL p95",
    "out tok",
    "e2e s",
    "finish",
)


def export_dir() -> Path:
    """Where exports go: phasechat's data directory (XDG_DATA_HOME moves it)."""
    return exports_dir()


class HistoryScreen(ModalScreen[None]):
    """A table of every answer's metrics, with JSONL and CSV export."""

    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > #box { width: 95%; height: 80%; background: $surface; border: thick $primary; }
    HistoryScreen DataTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close", id="history-close"),
        Binding("j", "export('jsonl')", "Export JSONL", id="history-jsonl"),
        Binding("c", "export('csv')", "Export CSV", id="history-csv"),
    ]

    def __init__(self, exchanges: list[Exchange]) -> None:
        super().__init__()
        self.exchanges = [e for e in exchanges if e.metrics is not None]

    def compose(self) -> ComposeResult:
        from textual.containers import Vertical

        with Vertical(id="box"):
            yield Static(f" {len(self.exchanges)} answers this session", id="title")
            yield DataTable(zebra_stripes=True, cursor_type="row")
            yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*COLUMNS)
        for i, e in enumerate(self.exchanges, 1):
            m = e.metrics
            assert m is not None
            approx = "~" if m.output_tokens_estimated else ""
            prompt = visible_controls(" ".join(e.user.content.split()))[:40]
            table.add_row(
                str(i),
                m.backend,
                prompt,
                "-" if m.prompt_tokens is None else f"{m.prompt_tokens:,}",
                "-" if m.cached_tokens is None else f"{m.cached_tokens:,}",
                fmt(m.ttft_ms, digits=0),
                fmt(m.prefill_tok_s),
                fmt(m.decode_tok_s),
                fmt(m.itl_ms_p50),
                fmt(m.itl_ms_p95),
                f"{approx}{m.output_tokens}",
                fmt((m.e2e_ms or 0) / 1000, digits=2),
                m.finish or "-",
            )

    def records(self) -> list[dict[str, object]]:
        return [e.export_record(i) for i, e in enumerate(self.exchanges, 1)]

    def action_export(self, kind: str) -> None:
        """Write the table to the exports folder and say where."""
        from datetime import datetime

        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        text = to_jsonl(self.records()) if kind == "jsonl" else to_csv(self.records())
        try:
            path = export_folder() / f"requests-{stamp}.{kind}"
            write_export(path, text)
        except OSError as exc:
            self.notify(f"export failed: {exc}", severity="error")
            return
        self.notify(f"exported {len(self.exchanges)} requests to {path}")
