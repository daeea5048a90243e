"""Markdown that costs nothing once written: a message's text as sealed pieces.

Textual's `Markdown` widget mounts one widget per block, and every layout pass (one per
refresh while an answer grows) visits all of them: 20,000 tokens made ~700 widgets and
~180 ms per pass, and every old message of a long chat added its blocks to each pass.
Here a message is a few `MarkdownPiece`s, each one widget rendered by Rich's Markdown
(cached per width). While an answer streams, its text is cut into pieces at block
boundaries: finished blocks are sealed into a piece that never changes again, and only
the open tail is re-rendered, so the cost of a refresh does not grow with the answer or
the chat.

Links are not terminal hyperlinks (an OSC 8 link would let a click open any scheme the
model wrote): a click on one runs the app's `follow_link` action with the URL as a
parameter (never parsed from the text), which checks and confirms it first.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable

from markdown_it import MarkdownIt
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.style import Style
from rich.theme import Theme
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.reactive import Reactive
from textual.strip import Strip
from textual.widget import Widget

#: A tail longer than this is sealed at its last safe block boundary.
SEAL_CHARS = 1500
#: A finished answer up to this long is redrawn as one piece (about 12 ms of Rich).
MERGE_CHARS = 32_000
#: A fenced code block longer than this is split into two fences (looks the same).
SPLIT_FENCE_CHARS = 4000
#: A streaming answer's open tail grows this many lines at a time (blank lines below
#: the text until it fills them): a new line then costs a repaint of the tail alone,
#: and only every STREAM_STEP lines a layout pass and a redraw of everything the chat
#: shows (the log scrolls to keep the end in view). bench/ui_cost.py measures it.
STREAM_STEP = 4
#: The same while an engine on this machine's CPU generates (the app draws at
#: chat_log.SHARED_HZ): a layout pass and a redraw of the screen every 8 lines instead
#: of 4 (the UI's CPU during a local answer: -8 ms per second, bench/README.md).
SHARED_STEP = 8
#: A streaming paragraph of plain prose whose open part is longer than this has its
#: finished lines drawn once, cached (`_Growing`): one paragraph of 20,000 tokens was
#: drawn whole at every frame (bench.tmux_ui --one-paragraph).
GROW_CHARS = 2000

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
#: A thematic break (`---`): the one block Rich draws no blank line after.
_RULE = re.compile(r"^ {0,3}([-*_])( *\1){2,} *$")


#: Rich's default inline code is "bold cyan on black": a black box on a light theme.
RICH_THEME = Theme({"markdown.code": "bold", "markdown.block_quote": "italic"})


class _ClickableLinks:
    """A Rich renderable whose links run `app.follow_link(url)` when clicked."""

    def __init__(self, markdown: RichMarkdown) -> None:
        self.markdown = markdown

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.markdown, options):
            style = segment.style
            if style is not None and style.link:
                meta = {"@click": ("app.follow_link", (style.link,))}
                style = style.update_link(None) + Style(underline=True) + Style.from_meta(meta)
                yield Segment(segment.text, style, segment.control)
            else:
                yield segment


class _Drawn:
    """A piece's lines as one Rich renderable (its `draw`, cached per width and theme),
    for what Textual asks of `render()`: painting and the height go through the line
    API (`render_line`, `get_content_height`) and never come here."""

    def __init__(self, piece: MarkdownPiece) -> None:
        self.piece = piece

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        new_line = Segment.line()
        lines = self.piece.draw(console, options)
        for line in lines:
            yield from line
            yield new_line
        for _ in range(self.piece.padded(len(lines)) - len(lines)):
            yield new_line


def sized_in_layout() -> Reactive[Size]:
    """`virtual_size` for widgets whose size only ever changes in a layout pass:
    Textual's asks for another pass when it changes, so every pass that resized a
    message (a streaming answer's growth step) was followed by one that changed nothing
    (4-5 ms of a 2-core machine's CPU, beside a local engine)."""
    return Reactive(Size(0, 0), layout=False)


class MarkdownPiece(Widget):
    """A run of whole Markdown blocks, drawn as one widget."""

    DEFAULT_CSS = "MarkdownPiece { height: auto; }"
    virtual_size = sized_in_layout()

    def __init__(self, source: str = "", *, lead: bool = False, classes: str | None = None) -> None:
        """`lead`: the piece before this one ends with a block that Rich follows with a
        blank line (`separated`): drawn first, unless Rich's own drawing of this piece
        starts with one (a list, a quote or a table does)."""
        super().__init__(classes=classes)
        self.source = source
        self._drawn_key: tuple[str, int, bool, bool] | None = None  # source, width, dark, lead
        self._drawn: list[list[Segment]] = []
        self._head_key: tuple[str, int, bool] | None = None  # while streaming (`draw`)
        self._head: list[list[Segment]] = []
        self._last = _Growing()  # the last block, while streaming
        #: height granularity: STREAM_STEP while an answer streams into this piece
        self.step = 1
        self.lead = lead

    def padded(self, lines: int) -> int:
        """The height drawn for `lines` lines: rounded up to a multiple of `step` (at
        least one step while streaming: the first line needs no layout pass)."""
        return max(-(-lines // self.step), self.step > 1) * self.step

    def set_step(self, step: int) -> None:
        """Grow in steps of `step` lines (1: exactly as tall as the text)."""
        if step != self.step:
            self.step = step
            if step == 1:  # settled: what was kept for streaming would outlive the lines
                self._last = _Growing()
            self.clear_cached_dimensions()
            self.refresh(layout=True)

    def draw(self, console: Console, options: ConsoleOptions) -> list[list[Segment]]:
        """The lines of the source at this width (rendered once per source and width).
        While an answer streams into it, the blocks before its last one are drawn once
        (then cached), and so are the finished lines of a last block of plain prose
        (`_Growing`): a new word re-renders the last block's open end, not the tail."""
        dark = self.app.current_theme.dark
        key = (self.source, options.max_width, dark, self.lead)
        if self._drawn_key != key:
            self._drawn_key = key
            options = options.update(height=None)
            if self.step > 1:
                head = seal_point(self.source, 0, split_fences=False)[0]
                text = self.source[:head]
                if head and self._head_key != (text, options.max_width, dark):
                    self._head_key = (text, options.max_width, dark)
                    self._head = _render(console, options, text, dark, self.lead)
                lead = separated(text) if head else self.lead
                rest = self._last.draw(console, options, self.source[head:], dark, lead)
                self._drawn = (self._head if head else []) + rest
            else:
                self._drawn = _render(console, options, self.source, dark, self.lead)
        return self._drawn

    def update(self, source: str) -> bool:
        """Show `source`: a repaint when it still fills as many lines (a streamed word
        that lands on the last line), a layout pass only when its height changed (then
        True)."""
        if source == self.source:
            return False
        self.source = source
        if self._drawn_key is not None:
            before = self._drawn
            console = self.app.console
            self.draw(console, console.options.update_width(self._drawn_key[1]))
            if self.padded(len(self._drawn)) == self.padded(len(before)):
                self._repaint_changed(before, self._drawn)
                return False
        self.clear_cached_dimensions()
        self.refresh(layout=True)
        return True

    def _repaint_changed(self, before: list[list[Segment]], after: list[list[Segment]]) -> None:
        """Repaint the lines that differ (a streamed word changes the last line or two:
        the rest of the piece, and what the screen has around it, are not drawn again)."""
        pairs = enumerate(zip(before, after, strict=False))
        first = next((y for y, (a, b) in pairs if a != b), min(len(before), len(after)))
        end = max(len(before), len(after))
        if end > first:
            self.refresh(Region(0, first, self.size.width, end - first))

    def render(self) -> _Drawn:
        return _Drawn(self)

    # Textual's line API: a paint turns only the lines on screen into strips (a sealed
    # piece of 20 KB is 300+ lines: all of them at every paint took 5-33 ms), and the
    # height is the cached lines' count (not a second pass over their segments).
    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        console = self.app.console
        return self.padded(len(self.draw(console, console.options.update_width(width))))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        console = self.app.console
        lines = self.draw(console, console.options.update_width(width))
        base = self.visual_style.rich_style
        if y >= len(lines):
            return Strip.blank(width, base)
        strip = Strip(lines[y]).apply_style(base)
        if not self.auto_links:
            return strip
        # As Textual styles the links of a rendered widget (`_Styled`): ours carry a
        # click action (`_ClickableLinks`).
        link = self.link_style
        return Strip(
            Segment(
                text, style + link if style and style.link_id and "@click" in style.meta else style
            )
            for text, style, _ in strip
        )


#: Markup that later text could still change, if it is drawn as written (an emphasis,
#: code span, link or autolink opened and not closed yet; a table's cell bar; an
#: escape): a cut is taken only where the lines before it show none of these. A closed
#: span is drawn without its marks and stays as it is: later delimiters only pair with
#: marks still open before them.
_OPEN_MARKUP = re.compile(r"[\\`*_~\[\]<|]")
#: Anything Markdown may read as more than the character itself (inline marks, an
#: entity, a tab): a head without any is drawn as its words, wrapped.
_MARKS = re.compile(r"[\\`*_~\[\]<>&!|\t]")


class _Growing:
    """A streaming tail's last block, drawn so that a long paragraph costs the same per
    new word however long it is: its finished lines (all but the last) are drawn once
    and cached, and only the text from the start of its last line is drawn again.

    Rich wraps a paragraph greedily, so a line's break depends only on the text before
    it: the text from the start of a drawn line, drawn on its own, gives the same lines
    as the rest of the paragraph. A cut is taken only at a word's start, on the first
    line of the paragraph's source (a newline could still make it a setext heading or
    a table), where the lines before it show no open markup (`_OPEN_MARKUP`), and where
    it held: both parts drawn and compared with the whole. A change of width, theme or
    text before the cut draws the block whole again.
    """

    def __init__(self) -> None:
        self._key: tuple[int, bool, bool] | None = None  # width, dark, lead
        self._text = ""  # the block's text whose lines are cached ...
        self._lines: list[list[Segment]] = []  # ... and those lines

    def draw(
        self, console: Console, options: ConsoleOptions, text: str, dark: bool, lead: bool
    ) -> list[list[Segment]]:
        """`text`'s lines (the last block of a tail, `lead` as `_render`'s)."""
        key = (options.max_width, dark, lead)
        if key != self._key or not text.startswith(self._text):
            self._key, self._text, self._lines = key, "", []
        rest = text[len(self._text) :]
        lead = lead and not self._text
        lines = _render(console, options, rest, dark, lead)
        drawn = self._lines + lines
        if len(rest) > GROW_CHARS:
            self._cut(console, options, rest, lines, dark, lead)
        return drawn

    def _cut(
        self,
        console: Console,
        options: ConsoleOptions,
        rest: str,
        lines: list[list[Segment]],
        dark: bool,
        lead: bool,
    ) -> None:
        """Cache `rest`'s lines but its last, if the text they hold can be cut there."""
        first = 1 if lead else 0
        end = len(lines) - 1
        if end <= first or (not self._text and _BLOCK_START.match(rest)):
            return
        # The last line's text as written ends the text (its words are plain): there
        # it starts.
        last = "".join(segment.text for segment in lines[end]).rstrip()
        written = rest.rstrip(" ")
        if not last or not written.endswith(last):
            return
        at = len(written) - len(last)
        head, tail = rest[:at], rest[at:]
        if not head.endswith(" ") or "\n" in head or "\r" in head:
            return
        if _BLOCK_START.match(tail) or _RULE.match(tail):
            return
        shown = "".join(segment.text for line in lines[first:end] for segment in line)
        if _OPEN_MARKUP.search(shown):
            return
        # Plain words (no mark of any kind) wrap greedily as they are: drawn alone, the
        # head is the lines above the cut (the catch-up of a fast stream draws 8 KB a
        # frame: a second drawing of it cost as much again).
        plain = _MARKS.search(head) is None
        if not plain and not _same(_render(console, options, head, dark, lead), lines[:end]):
            return
        if not _same(_render(console, options, tail, dark), lines[end:]):
            return
        self._text += head
        self._lines.extend(lines[:end])


def _same(a: list[list[Segment]], b: list[list[Segment]]) -> bool:
    """Whether two drawings show the same (a plain segment's style is None in one and
    an empty Style in the other, depending on what came before it in the paragraph)."""
    if a == b:
        return True
    null = Style()
    return len(a) == len(b) and all(
        len(x) == len(y)
        and all(
            s.text == t.text and (s.style or null) == (t.style or null) and s.control == t.control
            for s, t in zip(x, y, strict=True)
        )
        for x, y in zip(a, b, strict=True)
    )


def _render(
    console: Console, options: ConsoleOptions, text: str, dark: bool, lead: bool = False
) -> list[list[Segment]]:
    """`text`'s lines; `lead`: after a block Rich separates from the next by a blank
    line (drawn whole, the text would have one there)."""
    lines = console.render_lines(_ClickableLinks(_markdown(text, dark)), options, pad=False)
    # Rich starts a text that opens with a list, a quote or a table with an empty line
    # of its own: that one is the separator then.
    return [[], *lines] if lead and lines and lines[0] else lines


#: Rich's parser with Rich's extensions, made once (`Markdown(text)` builds a new one
#: every time), with raw HTML off: a tag is text (Rich drops HTML tokens, so an answer
#: about `<div>` lost its words and a `<details>` paragraph vanished). `_markdown` makes
#: one change to what it parses: a single newline breaks the line, as the model wrote
#: it (small models put one between paragraphs; CommonMark would run them together).
_PARSER = MarkdownIt("commonmark", {"html": False}).enable("strikethrough").enable("table")
_BLANK: dict[bool, RichMarkdown] = {}


def _markdown(text: str, dark: bool) -> RichMarkdown:
    """`RichMarkdown(text, ...)` with our parser: a copy of one made for "" (so every
    setting Rich keeps comes along) with `text` parsed in."""
    if dark not in _BLANK:
        theme = "monokai" if dark else "friendly"
        _BLANK[dark] = RichMarkdown("", code_theme=theme, hyperlinks=True)
    markdown = copy.copy(_BLANK[dark])
    markdown.markup, markdown.parsed = text, _PARSER.parse(text)
    for token in markdown.parsed:
        for child in token.children or ():
            if child.type == "softbreak":  # Rich draws it as a space
                child.type = "hardbreak"
    return markdown


def separated(text: str) -> bool:
    """Whether Rich draws a blank line between `text` (cut by `seal_point`) and what
    follows it: after a blank line, unless the block before it is a rule (which draws
    its own); none after a line break inside a paragraph or a fence."""
    lines = text.splitlines()
    if not lines or lines[-1].strip():
        return False
    return not _RULE.match(text.rstrip().rsplit("\n", 1)[-1])


_BLOCK_START = re.compile(r"([-*+]|\d{1,9}[.)])(\s|$)|[#>< \t]|=+\s*$")


def _plain(line: str) -> bool:
    """A line of prose that neither starts a block (heading, quote, list item, table,
    HTML, rule, setext underline) nor leaves an inline span open: a paragraph of such
    lines draws the same cut at any line end."""
    return bool(
        line.strip()
        and not _BLOCK_START.match(line)
        and not _RULE.match(line)
        and not _FENCE.match(line)
        and "|" not in line
        and line.count("`") % 2 == 0
        and line.count("*") % 2 == 0
        and line.count("[") == line.count("]")
    )


def seal_point(
    text: str, min_chars: int = SEAL_CHARS, *, split_fences: bool = True
) -> tuple[int, str]:
    """Where `text` (an answer's open tail) can be cut so that the part before renders
    the same on its own: (offset, prefix for what follows), or (0, "") for nowhere yet.

    A cut goes at a blank line outside a code fence that is followed by an unindented
    line (an indented one may continue a list item), or between two lines of a paragraph
    of plain prose (`_plain`: a single newline is a line break here). A fence longer than
    SPLIT_FENCE_CHARS is cut at a line end: the sealed part gets a closing fence and
    the rest `prefix`, a reopening one.
    """
    if len(text) < min_chars:
        return 0, ""
    best = 0
    fence: str | None = None
    fence_line = ""
    fence_start = 0
    offset = 0
    para: bool | None = None  # the paragraph so far is plain lines only (None: none open)
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else None
        match = _FENCE.match(line)
        if fence is not None:
            if line.strip().startswith(fence[0] * len(fence)):
                fence = None
        elif match:
            fence, fence_line, fence_start, para = match.group(1), line, offset, None
        elif not line.strip():
            para = None
            if following is not None and following.strip() and not following[0].isspace():
                best = offset + len(line)
        else:
            para = _plain(line) and para is not False
            if para and following is not None and _plain(following):
                best = offset + len(line)  # a line break inside a paragraph of prose
        offset += len(line)
    long_fence = fence is not None and offset - fence_start > SPLIT_FENCE_CHARS
    if split_fences and long_fence and "\n" in text:
        end = text.rfind("\n") + 1
        if end > fence_start + len(fence_line):
            return -end, fence_line if fence_line.endswith("\n") else fence_line + "\n"
    return best, ""


class MarkdownBody(Vertical):
    """A message's text: sealed pieces and one open tail, appended to as it streams."""

    DEFAULT_CSS = "MarkdownBody { height: auto; }"
    virtual_size = sized_in_layout()

    def __init__(self, source: str = "", *, step: int = 1, classes: str | None = None) -> None:
        """`step`: the tail's steps from the start (an answer about to stream: its first
        line then needs no layout pass of its own)."""
        super().__init__(classes=classes)
        self.source = source  # the whole text, as given
        self._tail = source  # the open tail as drawn (may start with a reopened fence)
        self._step = step

    def compose(self) -> Iterable[Widget]:
        tail = MarkdownPiece(self._tail, classes="tail")
        tail.step = self._step
        yield tail

    @property
    def tail(self) -> MarkdownPiece:
        return self.query_one(".tail", MarkdownPiece)

    @property
    def pieces(self) -> int:
        return len(self.children)

    async def append(self, text: str, step: int = STREAM_STEP) -> None:
        """Add streamed text; seal what can no longer change. While it streams, the
        tail grows `step` lines at a time (`settle` ends that)."""
        self.tail.set_step(step)
        self.source += text
        self._tail += text
        # Sealing mounts a piece: a layout pass. Done when the tail grew a step (a
        # layout pass then is due anyway), or at once when a lot came in one go (not
        # drawn whole first: a catch-up of 20 KB is 50 ms of Rich).
        if len(self._tail) < 2 * SEAL_CHARS and not self.tail.update(self._tail):
            return
        cut, reopen = seal_point(self._tail)
        if cut:
            end = abs(cut)
            sealed = self._tail[:end] + (_closing(reopen) if cut < 0 else "")
            self._tail = reopen + self._tail[end:]
            await self.mount(MarkdownPiece(sealed, lead=self.tail.lead), before=self.tail)
            self.tail.lead = cut > 0 and separated(sealed)  # a split fence: none
        self.tail.update(self._tail)

    def settle(self) -> None:
        """The stream ended: the tail is exactly as tall as its text again."""
        self.tail.set_step(1)

    async def replace(self, source: str) -> None:
        """Show `source` instead (a final text that differs from what was streamed)."""
        for piece in list(self.children)[:-1]:
            await piece.remove()
        self.source = self._tail = source
        self.tail.lead = False
        self.tail.update(source)


def _closing(opening: str) -> str:
    """The line that closes a fence opened by `opening`."""
    match = _FENCE.match(opening)
    return (match.group(1) if match else "```") + "\n"
