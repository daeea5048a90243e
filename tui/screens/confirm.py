"""A yes/no question in a modal: for what cannot be undone (deleting a chat) and what
leaves the app (opening a link a model wrote)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, Static


class ConfirmScreen(ModalScreen[bool]):
    """Shows `question` and `detail` (drawn as plain text); y answers True, n/Esc False."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 80%; height: auto; background: $surface;
        border: thick $warning; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm-yes"),
        Binding("n", "answer(False)", "No", id="confirm-no"),
        Binding("escape", "answer(False)", "No", id="confirm-escape", show=False),
    ]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content(self.question), classes="question")
            if self.detail:
                yield Static(Content(self.detail), classes="detail")
            yield Footer()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
