"""Edit the engine parameters (system prompt, temperature, max_tokens, stop sequences)."""

from __future__ import annotations

import json
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, Switch, TextArea

from phasechat.chat.config.settings import Settings, TrimConfig, parse_settings, parse_trim


class SettingsScreen(ModalScreen[tuple[Settings, TrimConfig] | None]):
    """A form; Save returns the new settings (the app applies and stores them)."""

    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > Vertical { width: 80; height: auto; background: $surface;
        border: thick $primary; padding: 0 1; }
    SettingsScreen TextArea { height: 5; }
    SettingsScreen Horizontal { height: auto; }
    SettingsScreen Horizontal Input { width: 1fr; }
    SettingsScreen #error { color: $error; height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Cancel", id="settings-cancel")
    ]

    def __init__(self, settings: Settings, trim: TrimConfig, profiles: list[str]) -> None:
        super().__init__()
        self.settings = settings
        self.trim = trim
        self.profiles = profiles

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical():
            yield Label("System prompt")
            yield TextArea(s.system, id="system")
            yield Label("Temperature")
            yield Input(str(s.temperature), id="temperature")
            yield Label("Max tokens")
            yield Input(str(s.max_tokens), id="max_tokens")
            yield Label("Stop sequences (JSON list)")
            yield Input(json.dumps(list(s.stop)), id="stop")
            t = self.trim
            yield Label("History trimmer: on · budget (blank: automatic) · keep last N turns")
            with Horizontal():
                yield Switch(t.enabled, id="trim_enabled")
                yield Input("" if t.budget is None else str(t.budget), id="trim_budget")
                yield Input(str(t.keep_last), id="trim_keep")
            yield Label("Summaries written by")
            yield Select(
                [(f"{name}", name) for name in self.profiles],
                prompt="the active backend",
                value=t.summarizer if t.summarizer in self.profiles else Select.NULL,
                id="trim_summarizer",
            )
            yield Static("", id="error")
            yield Button("Save", id="save", variant="primary")

    @on(Button.Pressed, "#save")
    def save(self) -> None:
        try:
            settings = parse_settings(
                self.settings,
                self.query_one("#system", TextArea).text,
                self.query_one("#temperature", Input).value,
                self.query_one("#max_tokens", Input).value,
                self.query_one("#stop", Input).value,
            )
            chosen = self.query_one("#trim_summarizer", Select).value
            trim = parse_trim(
                self.query_one("#trim_enabled", Switch).value,
                self.query_one("#trim_budget", Input).value,
                self.query_one("#trim_keep", Input).value,
                chosen if isinstance(chosen, str) else None,
            )
        except ValueError as exc:
            self.query_one("#error", Static).update(Content(str(exc)))
            return
        self.dismiss((settings, trim))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
