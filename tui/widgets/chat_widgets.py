"""The chat's widgets: one message, the prompt box."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.css.query import NoMatches
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Collapsible, Static, TextArea

from phasechat.chat.conversation import ChatMessage
from phasechat.chat.text import one_line, visible_controls
from phasechat.tui.widgets.markdown_view import MERGE_CHARS, MarkdownBody, sized_in_layout
from phasechat.tui.widgets.telemetry_view import PanelLine, fit_lines


class MessageView(Vertical):
    """One chat message: a header line and its Markdown body, streamed while it grows.

    The body seals finished blocks as it streams (tui/widgets/markdown_view.py): a refresh
    re-renders only the open tail, however long the answer and the chat.
    """

    virtual_size = sized_in_layout()
    DEFAULT_CSS = """
    MessageView { height: auto; margin: 0 0 1 0; padding: 0 1; }
    MessageView > .header { color: $text-muted; }
    MessageView.-user { background: $boost; border-left: outer $primary; }
    MessageView.-system { border-left: outer $warning; color: $text-muted; }
    MessageView.-assistant { border-left: outer $secondary; }
    MessageView.-error > .footer { color: $error; }
    MessageView > .footer { color: $text-muted; }
    MessageView.-summarized > MarkdownBody { color: $text-muted; }
    MessageView > .thinking { border: none; padding: 0; margin: 0;
                              background: transparent; color: $text-muted; }
    MessageView > .thinking > Contents { padding: 0 0 0 2; }
    MessageView:focus { background: $boost; border-left: thick $accent; }
    """

    can_focus = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "sibling(-1)", "‹ branch", id="message-previous-branch"),
        Binding("right", "sibling(1)", "branch ›", id="message-next-branch"),
        Binding("e", "edit", "Edit", id="message-edit"),
        Binding("t", "timeline", "Timeline", id="message-timeline"),
        Binding("c", "compare", "Compare branches", id="message-compare"),
        Binding("up", "move(-1)", "Up", id="message-up", show=False),
        Binding("down", "move(1)", "Down", id="message-down", show=False),
        Binding("escape", "leave", "Prompt", id="message-leave"),
    ]

    class EditRequested(Message):
        """`e` on a message: edit it (a question, or the system prompt)."""

        def __init__(self, message: ChatMessage) -> None:
            super().__init__()
            self.message = message

    class TimelineRequested(Message):
        """`t` on an answer: its own timeline (each token's gap, stalls, bursts)."""

        def __init__(self, message: ChatMessage) -> None:
            super().__init__()
            self.message = message

    class CompareRequested(Message):
        """`c` on a message with siblings: its branch and the next, side by side."""

        def __init__(self, message: ChatMessage) -> None:
            super().__init__()
            self.message = message

    class SiblingRequested(Message):
        """←/→ on a message with siblings: show the one `step` places away."""

        def __init__(self, message: ChatMessage, step: int) -> None:
            super().__init__()
            self.message = message
            self.step = step

    def __init__(
        self, message: ChatMessage, step: int = 1, branch: tuple[int, int] = (1, 1)
    ) -> None:
        """`step`: an answer about to stream grows this many lines at a time; `branch`:
        (its place among its siblings, how many there are)."""
        super().__init__(classes=f"-{message.role}")
        self.message = message
        self.branch = branch
        self._step = step
        self.shown = 0  # characters of the answer already written to the stream
        self._reasoning = message.reasoning
        self._reasoning_shown = -1  # characters of the thinking in its (unfolded) block

    def compose(self) -> ComposeResult:
        # Only the widgets this message shows: every layout pass walks every widget of
        # the chat (a thinking block is mounted when there is thinking; a question has
        # no footer).
        yield Static(self._header(), classes="header")
        # Links are opened by the app, after a check of their scheme (dialogs.open_link).
        yield MarkdownBody(visible_controls(self.message.content), step=self._step)
        if self.message.role == "assistant":
            yield Static("", classes="footer")

    def on_mount(self) -> None:
        m = self.message
        if m.reasoning:  # a saved answer: its figures are in its metrics
            figures = ""
            if m.metrics is not None and m.metrics.reasoning_ms is not None:
                tokens = m.metrics.reasoning_tokens or 0
                figures = f" {m.metrics.reasoning_ms / 1000:,.1f} s · {tokens:,} tokens"
            self.set_reasoning(m.reasoning, "thinking" + figures)

    @property
    def thinking(self) -> Collapsible:
        """A thinking model's chain of thought, folded (a click or the app's key opens
        it): there once `set_reasoning` had text."""
        return self.query_one(".thinking", Collapsible)

    def set_reasoning(self, text: str, title: str) -> None:
        """Show the thinking so far: the title always, the text only while unfolded (so
        a folded block costs nothing per refresh)."""
        self._reasoning = text
        if not text:
            return
        try:
            block = self.thinking
        except NoMatches:  # the first of it (most messages have none)
            block = Collapsible(Static("", classes="thinking-text"), classes="thinking")
            self.mount(block, after=self.query_one(".header"))
        block.title = title
        if not block.collapsed and len(text) != self._reasoning_shown:
            self._reasoning_shown = len(text)
            self.query_one(".thinking-text", Static).update(Content(visible_controls(text)))

    def on_collapsible_expanded(self, event: Collapsible.Expanded) -> None:
        self.set_reasoning(self._reasoning, self.thinking.title)

    def toggle_thinking(self) -> bool:
        """Fold or unfold the thinking; False when this message has none."""
        if not self._reasoning:
            return False
        self.thinking.collapsed = not self.thinking.collapsed
        return True

    def _header(self) -> Content:
        m = self.message
        note = ("  (summarized: the model now sees a summary)", "italic") if self.summarized else ""
        index, count = self.branch
        branch = (f"  ‹{index}/{count}›", "bold $accent") if count > 1 else ""
        if m.role == "user":
            return Content.assemble("you", branch, note)
        if m.role == "system":
            return Content.assemble(("system prompt", "italic"), branch)
        # The model id is the server's: shown, never interpreted.
        backend, model = one_line(m.backend or "assistant"), one_line(m.model or "")
        return Content.assemble((backend, "bold"), f" · {model}", branch, note)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys that do nothing here are not offered (the footer leaves them out)."""
        if action == "sibling":
            return self.branch[1] > 1
        if action == "edit":
            return self.message.role != "assistant"
        if action == "timeline":
            return self.message.role == "assistant"
        if action == "compare":
            return self.branch[1] > 1 and self.message.role != "system"
        return True

    def action_sibling(self, step: int) -> None:
        if self.branch[1] > 1:
            self.post_message(self.SiblingRequested(self.message, step))

    def action_edit(self) -> None:
        self.post_message(self.EditRequested(self.message))

    def action_compare(self) -> None:
        self.post_message(self.CompareRequested(self.message))

    def action_timeline(self) -> None:
        self.post_message(self.TimelineRequested(self.message))

    def action_move(self, step: int) -> None:
        """Focus the message above (-1) or below (1)."""
        views = list(self.parent.query_children(MessageView)) if self.parent else []
        index = views.index(self) + step
        if 0 <= index < len(views):
            views[index].focus()
            views[index].scroll_visible()

    def action_leave(self) -> None:
        """Back to the prompt box."""
        self.screen.query_one(PromptInput).focus()

    @property
    def summarized(self) -> bool:
        return self.has_class("-summarized")

    def mark_summarized(self, summarized: bool) -> None:
        """Dim a message the trimmer replaced by a summary (its text stays readable)."""
        if summarized != self.summarized:
            self.set_class(summarized, "-summarized")
            self.query_one(".header", Static).update(self._header())

    @property
    def markdown(self) -> MarkdownBody:
        return self.query_one(MarkdownBody)

    async def append(self, text: str, step: int) -> None:
        """Add streamed text (already decoded; made safe here); the text grows `step`
        lines at a time until `finish`."""
        if text:
            await self.markdown.append(visible_controls(text), step)

    async def finish(self, footer: Content) -> None:
        """Show the final text (only if the stream did not already show exactly it)."""
        final = visible_controls(self.message.content)
        # One piece for a finished message: every layout pass walks every widget of
        # the chat, so a long chat's old answers should each be few. Not for a very long
        # one: re-rendering 100 KB at once stalls the UI (keys wait) for ~100 ms.
        body = self.markdown
        body.settle()
        merge = body.pieces > 1 and len(final) <= MERGE_CHARS
        if body.source != final or merge:
            await body.replace(final)
        self.query_one(".header", Static).update(self._header())
        self.set_footer(footer)

    def set_footer(self, footer: Content) -> None:
        self.set_class(self.message.status == "error", "-error")
        self.query_one(".footer", Static).update(footer)


class PromptInput(TextArea):
    """Multi-line prompt: Enter sends, Ctrl+J (or Shift+Enter) adds a newline.

    Typed characters go in as one edit per burst, not one per key. A terminal without
    bracketed paste delivers a paste as one key event per character, and TextArea's every
    edit measures the whole line again (`WrappedDocument.wrap_range` rewraps it, and
    placing the cursor, `location_to_offset`, divides it into its wrapped sections): a
    storm of keys typed into one line cost time quadratic in its length (57,900 keys
    froze the UI for minutes). A key only joins the burst; the burst goes in when the keys
    queued before it have been handled, so each edit measures the line once for every
    key that was waiting.
    """

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class StopRequested(Message):
        """Esc in the prompt box: TextArea would otherwise swallow the app's Stop key."""

    def __init__(self, *, id: str | None = None, show_line_numbers: bool = False) -> None:
        super().__init__(id=id, show_line_numbers=show_line_numbers)
        self._typed: list[str] = []  # characters typed and not yet in the document

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and not self.read_only:
            event.prevent_default()  # TextArea's own handler would insert it now
            event.stop()
            if not self._typed:
                self.call_later(self.insert_typed)  # behind the keys already queued
            self._typed.append(event.character or "")
            return
        self.insert_typed()  # any other key acts on the text typed before it
        if event.key == "enter":
            event.prevent_default()
            event.stop()
            self.post_message(self.Submitted(self.text))
        elif event.key == "escape":
            event.prevent_default()
            event.stop()
            self.post_message(self.StopRequested())
        elif event.key in ("ctrl+j", "shift+enter"):
            event.prevent_default()
            event.stop()
            self.insert("\n")

    async def _on_paste(self, event: events.Paste) -> None:
        self.insert_typed()

    async def _on_mouse_down(self, event: events.MouseDown) -> None:
        self.insert_typed()

    def insert_typed(self) -> None:
        """Put the characters typed so far into the text, as one edit at the cursor
        (replacing a selection, as a typed key does)."""
        if not self._typed:
            return
        text = "".join(self._typed)
        self._typed.clear()
        self._restart_blink()
        if not self.read_only:
            start, end = self.selection
            self.replace(text, start, end, maintain_selection_offset=False)


class LivePanel(Widget):
    """A panel redrawn many times a second without a layout pass, which shows what
    matters most in the rows it has.

    `Static.update` asks for a relayout of the screen, which with a long chat means
    arranging every message again 15 times a second; this widget only repaints itself.
    It is given ranked lines (tui/widgets/telemetry_view.py `panel_lines`) and draws those that
    fit its size, wrapped as drawn, the most important first (`fit_lines`): a terminal
    too small for all of them loses the least important, never the one that matters.
    """

    DEFAULT_CSS = "LivePanel { height: 6; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: tuple[PanelLine, ...] = ()
        #: every line the panel means to say, in order (what it draws: `render`)
        self._content = Content("")

    def show(self, lines: Sequence[PanelLine]) -> None:
        """Say `lines` from now on (a repaint only if they changed)."""
        kept = tuple(lines)
        if kept != self._lines:
            self._lines = kept
            self._content = Content("\n").join(line.content for line in kept)
            self.refresh()

    def render(self) -> Content:
        size = self.size  # the content region: padding excluded
        return fit_lines(self._lines, size.width, size.height)
