"""A new name for something, typed in a modal: Enter keeps it, Esc leaves the old one."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class RenameScreen(ModalScreen[str | None]):
    """Asks for a new name for `old` (drawn as plain text); answers it, or None."""

    DEFAULT_CSS = """
    RenameScreen { align: center middle; }
    RenameScreen > Vertical { width: 70; height: auto; background: $surface;
        border: thick $primary; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="rename-cancel")
    ]

    def __init__(self, question: str, old: str) -> None:
        super().__init__()
        self.question, self.old = question, old

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content(self.question))
            yield Input(self.old, id="new-name")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        new = event.value.strip()
        self.dismiss(new if new and new != self.old else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
