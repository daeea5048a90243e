"""An App whose notifications are always plain text with controls made visible.

Notifications quote servers (error bodies, model ids), files (theme errors, paths) and
chat titles. Parsed as Textual markup, a `[/]` in any of them raised MarkupError; written
as they are, an OSC 0 or OSC 52 in them reached the terminal. One override, so no call
site can forget: `markup` is accepted for Textual's signature and ignored.
"""

from __future__ import annotations

from textual.app import App
from textual.notifications import SeverityLevel

from phasechat.chat.text import visible_controls


class PlainTextApp(App[None]):
    """`notify` never parses markup and never passes a control character on."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        super().notify(
            visible_controls(message),
            title=visible_controls(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )
