"""A modal report: a heading and a long text below it, scrolled together; Esc closes.
The prompt view and an answer's timeline are such reports."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, Static


class ReportScreen(ModalScreen[None]):
    """Subclasses give `head()` and `body()` (drawn as text, never markup)."""

    DEFAULT_CSS = """
    ReportScreen { align: center middle; }
    ReportScreen > #box { width: 95%; height: 90%; background: $surface; border: thick $primary; }
    ReportScreen #text { padding: 1 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close", id="report-close"),
    ]

    def head(self) -> Content:
        raise NotImplementedError

    def body(self) -> Content:
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            with VerticalScroll():
                yield Static(self.head(), id="head")
                yield Static(self.body(), id="text")
            yield Footer()
