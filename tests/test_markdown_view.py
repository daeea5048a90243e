"""Sealing a streamed answer into pieces: each piece renders on its own as it would have
inside the whole text (tui/markdown_view.py)."""

from __future__ import annotations

from rich.console import Console
from rich.markdown import Markdown

from phasechat.backends.openai import RemoteBackend, RemoteConfig
from phasechat.chat.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.markdown_view import SEAL_CHARS, SPLIT_FENCE_CHARS, seal_point
from phasechat.tui.widgets import MessageView
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


async def test_a_long_streamed_answer_is_a_few_pieces_and_ends_on_screen() -> None:
    """3,000 tokens at socket speed (faster than a model): the whole text is shown, its
    last token on screen, in a bounded number of widgets (not one per paragraph)."""
    with fault_server_thread() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="fastend-3000"))
        app = PhasechatApp(settings=Settings(max_tokens=3010), backend=backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(lambda: backend.state == "ready")
            app.send("go")
            await wait_for(lambda: bool(app.session.exchanges) and not app.generating)
            answer = app.session.exchanges[-1].answer
            body = list(app.query(MessageView))[-1].markdown
            assert answer.content.rstrip().endswith("end1")
            assert body.source == answer.content
            paragraphs = answer.content.count("\n\n")
            assert paragraphs == 50
            assert 3 <= body.pieces <= len(answer.content) // (SEAL_CHARS // 2)
            assert "end1" in (await screen_text(pilot))
        await backend.aclose()
