"""The prompt view: the exact text the engine read for one answer, its sections marked,
the template's own text visible, and the point where the engine's cached prefix ended.

Every string in it came from outside (the chat, the template, the answer): it is drawn
as text (Content), never parsed as markup, its control characters made visible.
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content

from phasechat.chat.engine_held import name_of
from phasechat.chat.text import one_line, visible_controls
from phasechat.telemetry.anatomy import Anatomy
from phasechat.tui.screens.report_screen import ReportScreen
from phasechat.tui.widgets.clip import clipped
from phasechat.tui.widgets.telemetry_view import SECTION_STYLE, anatomy_line, fmt

SOURCES = {
    "tokenizer": "exact: the local model's own template and tokenizer",
    "server": "exact: the server's own template and tokenizer",
    "estimate": "estimated: this server does not show its template or tokenizer",
}
CACHE_MARK = "⟦cached prefix ends here⟧"


def section_table(anatomy: Anatomy) -> Content:
    """One line per section: its tokens, cached, read, and the prefill time it cost."""
    approx = "~" if anatomy.source == "estimate" else ""
    rows = [
        Content.styled(
            f"{'section':<16}{'tokens':>9}{'cached':>9}{'read':>9}{'prefill ms':>12}", "bold"
        )
    ]

    def count(n: int | None) -> str:
        return "-" if n is None else f"{approx}{n:,}"

    for s in anatomy.sections:
        if not s.tokens:
            continue
        name = name_of(s.kind, s.message_index)
        cells = (
            f"{count(s.tokens):>9}{count(s.cached_tokens):>9}"
            f"{count(s.evaluated_tokens):>9}{fmt(s.prefill_ms, digits=1):>12}"
        )
        rows.append(Content.assemble((f"{name:<16}", SECTION_STYLE[s.kind]), cells))
    rows.append(
        Content.assemble((f"{'the prompt':<16}", "bold"), f"{count(anatomy.prompt_tokens):>9}")
    )
    return Content("\n").join(rows)


def marked_text(anatomy: Anatomy) -> Content:
    """The prompt's text: each section's text after its label, the template's own text
    dim between them, and `CACHE_MARK` where the cached prefix ended."""
    text, cut = anatomy.text, anatomy.cached_chars
    parts: list[str | tuple[str, str]] = []

    def add(start: int, end: int, style: str) -> None:
        """text[start:end], split at the cache's end when it falls inside."""
        if cut is not None and start <= cut < end:
            add(start, cut, style)
            parts.append((CACHE_MARK, "bold reverse $phase-decode"))
            start = cut
        if start < end:
            parts.append((visible_controls(text[start:end]), style))

    at = 0
    for start, end, index in sorted(anatomy.spans):
        add(at, start, "dim")
        section = anatomy.sections[index]
        label = f"⟨{name_of(section.kind, section.message_index)}⟩"
        parts.append((label, f"bold {SECTION_STYLE[section.kind]}"))
        add(start, end, "")
        at = end
    add(at, len(text), "dim")
    if cut is not None and cut >= len(text):
        parts.append((CACHE_MARK, "bold reverse $phase-decode"))
    return Content.assemble(*parts)


class PromptView(ReportScreen):
    """One answer's prompt: its sections, the cache break, and the exact text read."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("f8", "dismiss", "Close", show=False)]

    def __init__(self, anatomy: Anatomy, title: str) -> None:
        super().__init__()
        self.anatomy = anatomy
        self.title_text = title

    def head(self) -> Content:
        a = self.anatomy
        head = [
            Content.assemble((self.title_text, "bold"), f"   ({SOURCES.get(a.source, a.source)})"),
            anatomy_line(a, width=60, hint=""),
            section_table(a),
        ]
        if a.cache_break is not None:
            head.append(Content.styled(f"⚠ {one_line(a.cache_break.line())}", "$warning"))
        elif a.cached_chars is not None:
            head.append(Content.styled(f"{CACHE_MARK}: the engine read from there on", "dim"))
        return Content("\n\n").join(head)

    def body(self) -> Content:
        if self.anatomy.text:
            return clipped(marked_text(self.anatomy))  # a long chat's: its start and end
        return Content.styled("(the prompt's text is kept only while the chat is open)", "dim")
