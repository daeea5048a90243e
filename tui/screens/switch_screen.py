"""Choose the backend that answers next, seeing first what the switch will cost."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.text import one_line


class SwitchScreen(ModalScreen[str | None]):
    """Lists backend profiles with the history's size there and the re-prefill cost."""

    DEFAULT_CSS = """
    SwitchScreen { align: center middle; }
    SwitchScreen > Vertical { width: 90; height: auto; max-height: 80%;
        background: $surface; border: thick $primary; padding: 0 1; }
    SwitchScreen OptionList { height: auto; max-height: 20; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Cancel", id="switch-cancel")
    ]

    def __init__(
        self,
        profiles: list[tuple[BackendSpec, str]],
        current: str,
        title: tuple[str, str] = ("Switch backend", "  (the chat carries over)"),
    ) -> None:
        """`profiles`: each spec with a one-line cost note computed by the app; `title`:
        the heading and a note after it (the compare picker has its own)."""
        super().__init__()
        self.profiles = profiles
        self.current = current
        self.title_parts = title

    def compose(self) -> ComposeResult:
        with Vertical():
            heading, note = self.title_parts
            yield Static(Content.assemble((heading, "bold"), note))
            options = []
            for spec, cost in self.profiles:
                mark = "● " if spec.name == self.current else "  "
                label = Content.assemble(
                    (f"{mark}{one_line(spec.name)}", "bold"),
                    f"  {one_line(spec.describe)}\n    ",
                    (cost, "dim"),
                )
                options.append(Option(label, id=spec.name))
            yield OptionList(*options)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
