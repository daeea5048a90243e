"""Sealing a streamed answer into pieces: each piece renders on its own as it would have
inside the whole text (tui/widgets/markdown_view.py)."""

from __future__ import annotations

import pytest
from rich.console import Console, ConsoleOptions
from rich.markdown import Markdown
from rich.segment import Segment
from rich.style import Style

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_log import FRAME_CHARS
from phasechat.tui.widgets.chat_widgets import MessageView
from phasechat.tui.widgets.markdown_view import (
    RICH_THEME,
    SEAL_CHARS,
    SPLIT_FENCE_CHARS,
    MarkdownBody,
    MarkdownPiece,
    _markdown,
    seal_point,
)
from tests.fault_server import fault_server_thread
from tests.test_tui_faults import screen_text, wait_for


def rendered(text: str) -> str:
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(Markdown(text))
    return console.export_text()


def cut_all(text: str, step: int = 7) -> list[str]:
    """Stream `text` in `step`-character fragments, sealing as the widget does."""
    pieces, tail = [], ""
    for i in range(0, len(text), step):
        tail += text[i : i + step]
        cut, reopen = seal_point(tail)
        if cut:
            end = abs(cut)
            fence = reopen.strip()
            pieces.append(tail[:end] + (fence[:3] + "\n" if cut < 0 else ""))
            tail = reopen + tail[end:]
    return [*pieces, tail]


def test_short_text_is_never_cut() -> None:
    assert seal_point("one\n\ntwo\n\nthree") == (0, "")


def test_paragraphs_are_sealed_at_blank_lines_and_render_the_same() -> None:
    text = "".join(f"Paragraph {i} " + "word " * 40 + "\n\n" for i in range(60))
    pieces = cut_all(text)
    assert len(pieces) > 3
    assert "".join(pieces) == text
    assert all(p.endswith("\n\n") for p in pieces[:-1])
    assert all(len(p) < SEAL_CHARS + 400 for p in pieces)  # the tail never grows long
    assert "".join(rendered(p) for p in pieces).split() == rendered(text).split()


def test_prose_with_single_newlines_is_cut_at_a_line_end() -> None:
    """A small model's paragraphs, one newline apart: one block to CommonMark, cut at a
    line end (each line is drawn on its own line here), never inside an open span."""
    text = "".join(f"Line {i}: " + "word " * 12 + "\n" for i in range(60))
    cut, reopen = seal_point(text)
    assert reopen == "" and text[:cut].endswith("\n") and text[cut:].startswith("Line 59")
    # Not between a line that opens an emphasis and the one that closes it, not
    # inside a list item or a quote, not before a setext underline.
    for opened in ("*a span " + "word " * 400 + "\nstill the span*\n", "> q " * 400 + "\nlazy\n"):
        assert seal_point(opened)[0] == 0
    assert seal_point("Title " * 300 + "\n===\n")[0] == 0
    assert seal_point("- item " * 300 + "\nlazy continuation\n")[0] == 0


def test_an_indented_continuation_is_not_cut_from_its_list_item() -> None:
    item = "- item " + "x " * 900 + "\n\n  continued paragraph of the same item\n\nafter\n"
    cut, _ = seal_point(item)
    assert item[:cut].endswith("continued paragraph of the same item\n\n")


def test_no_cut_inside_a_short_code_fence() -> None:
    text = "intro\n\n```\n" + "a = 1\n\n" * 300 + "```\n"
    cut, reopen = seal_point(text[:-4])  # the fence is still open
    assert reopen == "" and cut == len("intro\n\n")


def test_a_long_code_fence_is_split_into_two_fences() -> None:
    code = "".join(f"line_{i} = {i}\n" for i in range(600))
    text = "intro\n\n```python\n" + code + "```\n\nafter\n"
    assert len(code) > SPLIT_FENCE_CHARS
    pieces = cut_all(text, step=50)
    assert any(p.startswith("```python\n") for p in pieces[1:])  # reopened with its language
    shown = "".join(rendered(p) for p in pieces)
    for i in (0, 299, 599):
        assert f"line_{i} = {i}" in shown
    assert "```" not in shown  # every fence closed: no fence marker leaks as text


async def test_a_long_streamed_answer_is_a_few_pieces_and_ends_on_screen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3,000 tokens at socket speed (faster than a model): the whole text is shown, its
    last token on screen, in a bounded number of widgets (not one per paragraph) while
    it streams, and in one once it is finished."""
    most = 0
    biggest = 0  # the most new text drawn at once
    append = MarkdownBody.append

    async def counted(self: MarkdownBody, text: str, step: int) -> None:
        nonlocal most, biggest
        await append(self, text, step)
        most = max(most, self.pieces)
        biggest = max(biggest, len(text))

    monkeypatch.setattr(MarkdownBody, "append", counted)
    with fault_server_thread() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="fastend-3000"))
        app = PhasechatApp(settings=Settings(max_tokens=3010), backend=backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(lambda: backend.state == "ready")
            app.chat.send("go")
            await wait_for(lambda: bool(app.turns.exchanges) and not app.chat.generating)
            answer = app.turns.exchanges[-1].answer
            body = list(app.query(MessageView))[-1].markdown
            assert answer.content.rstrip().endswith("end1")
            assert body.source == answer.content
            paragraphs = answer.content.count("\n\n")
            assert paragraphs == 50
            assert 2 <= most <= len(answer.content) // (SEAL_CHARS // 2)  # sealed as it came
            assert body.pieces == 1
            assert "end1" in (await screen_text(pilot))
            # Caught up a frame's worth at a time (a key typed meanwhile waits less).
            assert FRAME_CHARS // 2 < biggest <= FRAME_CHARS
        await backend.aclose()


async def test_a_streaming_tail_grows_a_few_lines_at_a_time_and_settles_exact() -> None:
    """While an answer streams, its tail is a multiple of STREAM_STEP lines tall (a new
    line inside that reserve is a repaint, not a layout of the whole chat); once it
    settles, it is exactly as tall as its text."""
    from textual.app import App, ComposeResult

    from phasechat.tui.widgets.markdown_view import STREAM_STEP

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield MarkdownBody(step=STREAM_STEP)  # an answer about to stream

    app = One()
    seen: list[tuple[int, int]] = []  # (laid-out height, text lines)
    async with app.run_test(size=(40, 30)) as pilot:
        body = app.query_one(MarkdownBody)
        # Empty, it already holds one step: its first line is no layout pass either.
        assert body.tail.size.height == STREAM_STEP
        for i in range(66):
            await body.append(f"word{i} ")
            await pilot.pause()
            seen.append((body.tail.size.height, len(body.tail._drawn)))
        text_lines = seen[-1][1]
        assert text_lines > 2 * STREAM_STEP and text_lines % STREAM_STEP
        assert all(h % STREAM_STEP == 0 and h >= lines for h, lines in seen)
        assert len({h for h, _ in seen}) <= text_lines // STREAM_STEP + 1
        body.settle()
        await pilot.pause()
        assert body.tail.size.height == text_lines


async def test_a_catch_up_is_sealed_before_it_is_drawn() -> None:
    """20 KB in one append (a stream faster than the UI draws) is cut at its last block
    boundary first: the tail is never drawn with all of it (50 ms of Rich, twice)."""
    from textual.app import App, ComposeResult

    from phasechat.tui.widgets.markdown_view import STREAM_STEP, MarkdownPiece

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield MarkdownBody(step=STREAM_STEP)

    drawn: list[tuple[bool, int]] = []  # (the tail?, characters) of each render
    draw = MarkdownPiece.draw

    def spy(self: MarkdownPiece, console: Console, options: ConsoleOptions) -> list[list[Segment]]:
        key = (self.source, options.max_width, self.app.current_theme.dark, self.lead)
        if self._drawn_key != key:  # draw's own test: a render, not its cached lines
            drawn.append((self.has_class("tail"), len(self.source)))
        return draw(self, console, options)

    text = "".join(f"Paragraph {i}: " + "word " * 60 + "\n\n" for i in range(60))
    app = One()
    async with app.run_test(size=(80, 30)) as pilot:
        MarkdownPiece.draw = spy  # type: ignore[method-assign]
        try:
            body = app.query_one(MarkdownBody)
            await body.append("Start.\n\n")
            await body.append(text)
            await pilot.pause()
        finally:
            MarkdownPiece.draw = draw  # type: ignore[method-assign]
        assert body.source == "Start.\n\n" + text and body.pieces == 2
        assert max(n for tail, n in drawn if not tail) > 15_000  # the sealed piece
        assert max(n for tail, n in drawn if tail) < 2 * SEAL_CHARS


@pytest.mark.parametrize("step", [1, 8])
async def test_streamed_pieces_draw_what_the_whole_text_draws(step: int) -> None:
    """Sealed pieces stacked (with the blank line Rich puts between two blocks: none
    after a rule, Rich's own before a list or a quote) show the same lines as the whole
    text drawn at once; so does a streaming tail drawn as its cached first blocks and
    its last one (step > 1)."""
    from textual.app import App, ComposeResult

    blocks = [
        "# A heading",
        "Some prose " * 30,
        "- one\n- two\n  continued\n- three",
        "```python\n" + "x = 1\n" * 20 + "```",
        "---",
        "More prose " * 40,
        "> a quote " * 10,
        "1. first\n2. second",
        "The end " * 25,
        "\n".join(f"Line {k} of prose, as a small model writes it." for k in range(30)),
    ]
    text = "\n\n".join(blocks * 4) + "\n"
    # a first piece sealed just after a rule (no blank line below it), in one append
    first = "Prose " * 300 + "\n\n---\n\n"
    width = 70

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield MarkdownBody()

    app = One()
    async with app.run_test(size=(width, 40)) as pilot:
        body = app.query_one(MarkdownBody)
        await body.append(first + "Next.\n", step)
        assert body.query(MarkdownPiece).first().source.endswith("---\n\n")
        text = first + "Next.\n" + text
        for i in range(len(first) + 6, len(text), 97):
            await body.append(text[i : i + 97], step)
        await pilot.pause()
        assert body.pieces >= 3
        shown: list[str] = []
        for piece in body.query(MarkdownPiece):
            lines = ["".join(s.text for s in line).rstrip() for line in piece._drawn]
            shown += lines
        drawn_at = body.tail._drawn_key
        assert drawn_at is not None
        console = Console(width=drawn_at[1], theme=RICH_THEME)
        whole = console.render_lines(
            _markdown(text, app.current_theme.dark), console.options, pad=False
        )
        expected = ["".join(s.text for s in line).rstrip() for line in whole]
        while shown[-1] == "":  # the tail's reserve below the text (step > 1)
            shown.pop()
        assert shown == expected


@pytest.mark.parametrize("dark", [True, False])
def test_our_markdown_draws_what_richs_own_draws(dark: bool) -> None:
    """One parser for every render (not one per `Markdown(...)`), and one change: a
    single newline breaks the line (Rich joins the lines with a space)."""
    text = (
        "# Title\n\nSome *em* and **strong** and ~~struck~~ and `code`, a [link](https://x.org)."
        "\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```"
        "\n\n> quote\n\n- x\n- y\n"
    )
    console = Console(width=60, theme=RICH_THEME)
    theme = "monokai" if dark else "friendly"
    ours = console.render_lines(_markdown(text, dark), console.options, pad=False)
    richs = console.render_lines(
        Markdown(text, code_theme=theme, hyperlinks=True), console.options, pad=False
    )
    assert ours == richs and len(ours) > 12
    lines = console.render_lines(_markdown("One.\nTwo.", dark), console.options, pad=False)
    assert ["".join(s.text for s in line).rstrip() for line in lines] == ["One.", "Two."]


async def test_a_growth_step_is_one_layout_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual follows a pass that resized a widget with another one (its virtual size
    changed); the message's widgets take their size from the pass alone."""
    from textual.app import App, ComposeResult
    from textual.screen import Screen

    from phasechat.tui.widgets.chat_widgets import MessageView
    from phasechat.tui.widgets.markdown_view import STREAM_STEP

    passes = 0
    layout = Screen._refresh_layout

    def counted(self: Screen[object], *args: object, **kwargs: object) -> None:
        nonlocal passes
        passes += 1
        layout(self, *args, **kwargs)  # type: ignore[arg-type]

    class One(App[None]):
        def compose(self) -> ComposeResult:
            from phasechat.chat.conversation import ChatMessage

            yield MessageView(ChatMessage("assistant", ""), STREAM_STEP)

    app = One()
    async with app.run_test(size=(40, 30)) as pilot:
        body = app.query_one(MarkdownBody)
        await pilot.pause(0.1)
        monkeypatch.setattr(Screen, "_refresh_layout", counted)
        heights = set()
        for i in range(3 * STREAM_STEP):  # a line each: from one step to three
            await body.append(f"line {i}\n", STREAM_STEP)
            await pilot.pause(0.05)
            heights.add(body.tail.size.height)
        assert heights == {STREAM_STEP, 2 * STREAM_STEP, 3 * STREAM_STEP}
        assert passes == 2  # one per growth step


async def test_a_streamed_word_repaints_only_the_lines_it_changed() -> None:
    """A word that lands inside the tail's reserve repaints from the first line that
    differs (not the whole piece: what the screen has around it is not drawn again),
    and the screen then shows what the whole text, drawn at once, shows."""
    from textual.app import App, ComposeResult
    from textual.geometry import Region

    from phasechat.tui.widgets.markdown_view import SHARED_STEP

    class One(App[None]):
        def __init__(self, text: str = "") -> None:
            super().__init__()
            self.text = text

        def compose(self) -> ComposeResult:
            yield MarkdownBody(self.text, step=SHARED_STEP)

    words = [f"word{i}" for i in range(60)]
    repainted: list[tuple[Region, ...]] = []
    app = One()
    async with app.run_test(size=(40, 30)) as pilot:
        body = app.query_one(MarkdownBody)
        tail = body.tail
        refresh = tail.refresh

        def spy(*regions: Region, **kwargs: bool) -> MarkdownPiece:
            if not kwargs.get("layout"):
                repainted.append(regions)
            return refresh(*regions, **kwargs)

        await body.append("A first paragraph.\n\n", SHARED_STEP)
        await pilot.pause()
        tail.refresh = spy  # type: ignore[method-assign]
        for word in words:
            await body.append(word + " ", SHARED_STEP)
            await pilot.pause()
        streamed = await screen_text(pilot)
    # A word repaints one region, from the line it changed: never line 0 (the first
    # paragraph), and a word that stays on its line repaints that line only. The whole
    # piece is repainted only by Textual, when a growth step resizes it.
    partial = [r[0] for r in repainted if r]
    assert len(partial) > 50 and len(repainted) - len(partial) <= 2
    assert all(r.y >= 1 for r in partial)
    assert sum(r.height == 1 for r in partial) > len(partial) * 0.9
    whole = One("A first paragraph.\n\n" + " ".join(words) + " ")
    async with whole.run_test(size=(40, 30)) as pilot:
        assert await screen_text(pilot) == streamed


def test_text_that_looks_like_html_is_drawn_as_written() -> None:
    console = Console(width=80, theme=RICH_THEME)

    def drawn(text: str) -> str:
        lines = console.render_lines(_markdown(text, True), console.options, pad=False)
        return "\n".join("".join(s.text for s in line).rstrip() for line in lines).strip()

    assert drawn("my prompt has <b>bold</b> and <div> tags") == (
        "my prompt has <b>bold</b> and <div> tags"
    )
    assert drawn("Use `<script>` sparingly; a <script src=x> tag runs code.") == (
        "Use <script> sparingly; a <script src=x> tag runs code."
    )
    assert drawn("<details>\nThe folded part.\n</details>") == (
        "<details>\nThe folded part.\n</details>"
    )
    assert drawn("JSX: <Button onClick={go}>Go</Button>") == "JSX: <Button onClick={go}>Go</Button>"


def _one_paragraph(words: int, extra: dict[int, str]) -> str:
    """`words` words in one paragraph (no newline), some replaced by `extra`."""
    return " ".join(extra.get(i, f"w{i}") for i in range(words)) + " ZZEND"


@pytest.mark.parametrize(
    "text",
    [
        # plain prose, with words that would start a block at a line's start, and one
        # longer than the screen is wide (folded)
        _one_paragraph(5000, {7: "-", 300: "1.", 301: "#", 900: ">", 901: "+", 1200: "x" * 150}),
        # an emphasis opened early and closed 20 KB later: no cut may keep the `*`
        _one_paragraph(4000, {5: "*opened", 3900: "closed*"}),
        # closed spans (code, a link, strong) early on and on the way; a paragraph before
        "First paragraph.\n\n"
        + _one_paragraph(4000, {3: "`code`", 9: "[a](https://x.org)", 2500: "**strong**"}),
        # a second long line after the first (a line break: the last block is new)
        _one_paragraph(2500, {}) + "\nNext " + _one_paragraph(2500, {}),
    ],
    ids=["plain", "emphasis", "after-markup", "next-line"],
)
async def test_one_long_paragraph_draws_what_the_whole_draws_at_a_bounded_cost(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """A streaming paragraph with no block boundary to seal at (issue 48: 20,000 tokens
    in one paragraph drew the whole paragraph at every frame): its finished lines are
    drawn once; every frame shows exactly what the whole text drawn at once shows (the
    same segments), also after the terminal's width changes; and unless a mark is
    left open (which a later one could close), the text drawn per append stays under a
    bound that does not grow with the paragraph."""
    from textual.app import App, ComposeResult

    from phasechat.tui.widgets import markdown_view
    from phasechat.tui.widgets.markdown_view import GROW_CHARS, SHARED_STEP, _render

    rendered_now = 0  # characters given to Rich since the last append
    per_append: list[int] = []
    render = markdown_view._render

    def counted(
        console: Console, options: ConsoleOptions, source: str, dark: bool, lead: bool = False
    ) -> list[list[Segment]]:
        nonlocal rendered_now
        rendered_now += len(source)
        return render(console, options, source, dark, lead)

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield MarkdownBody(step=SHARED_STEP)

    def shown(lines: list[list[Segment]]) -> list[list[tuple[str, Style]]]:
        # What a line shows: Rich leaves a plain segment's style None or empty
        return [[(s.text, s.style or Style()) for s in line] for line in lines]

    def whole(piece: MarkdownPiece) -> list[list[tuple[str, Style]]]:
        console = piece.app.console
        assert piece._drawn_key is not None
        options = console.options.update_width(piece._drawn_key[1]).update(height=None)
        dark = piece.app.current_theme.dark
        return shown(_render(console, options, piece.source, dark, piece.lead))

    app = One()
    chunk = 97
    resized = 0
    async with app.run_test(size=(60, 30)) as pilot:
        body = app.query_one(MarkdownBody)
        monkeypatch.setattr(markdown_view, "_render", counted)
        for n, i in enumerate(range(0, len(text), chunk)):
            if i >= len(text) // 3 > i - chunk:
                await pilot.resize_terminal(47, 30)  # a new width: drawn whole once
                await pilot.pause()
                resized = n
            rendered_now, pieces = 0, body.pieces
            await body.append(text[i : i + chunk], SHARED_STEP)
            # a paragraph sealed into a piece of its own is drawn there once: not counted
            per_append.append(rendered_now if body.pieces == pieces else 0)
            if n % 25 == 0 or i + chunk >= len(text):
                assert shown(body.tail._drawn) == whole(body.tail)
        await pilot.pause()
        assert body.source == text and "ZZEND" in "".join(s.text for s in body.tail._drawn[-1])
        uncached = len(body.tail.source) - len(body.tail._last._text)  # drawn each time
    if "*opened" not in text:  # no open markup: bounded per append, after a cut
        late = [x for k, x in enumerate(per_append) if k > 40 and abs(k - resized) > 1]
        assert max(late) <= 2 * (GROW_CHARS + 2 * chunk)
        assert uncached <= GROW_CHARS + 2 * chunk
    else:  # a mark open until 20 KB later: drawn whole until then (correct, not cheap)
        assert max(per_append) > len(text) // 2
