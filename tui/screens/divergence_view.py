"""An answer's divergence, drawn: B's next-token distributions against A's over A's
answer, teacher-forced (chat/trips/diverge.py), each token shaded by its KL as the
timeline shades its gaps (timeline_view.SHADE_COLOURS), the tokens where the two sides'
most likely next tokens differ underlined, the first of them marked, and the summary
line. The text came from a model: drawn as text, its control characters made visible.

Teacher forcing reads the whole sequence on each side (chat/trips/forced_sides.py): the
model here loads again and reads in a worker thread, a server answers requests; the view
says how far each has read, and Esc stops it at its next batch or request. Where a side
is a server, the summary says the KL is over each side's top k (a lower bound), and a
server's answer is drawn as its server's tokenizer splits it.
"""

from __future__ import annotations

import asyncio
import bisect
import codecs
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

from textual import work
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.widgets import Static

from phasechat.backends.base import Backend, Stopped
from phasechat.backends.events import AnswerTokens, Message
from phasechat.chat.text import visible_controls
from phasechat.chat.trips import forced_sides
from phasechat.chat.trips.forced_sides import (
    Reader,
    Teaching,
    caveats,
    teaching,
    vocabulary_check,
)
from phasechat.telemetry.divergence import Divergence
from phasechat.tui.screens.report_screen import ReportScreen
from phasechat.tui.screens.timeline_view import SHADE_COLOURS
from phasechat.tui.widgets.clip import clipped

#: KL (nats) where each shade after the first begins: exactly or nearly the same
#: distribution, then each tenfold more
KL_BOUNDS = (1e-4, 1e-3, 1e-2, 1e-1)
#: the mark before the first token whose most likely next tokens differ
FIRST_MARK = "▶"


def kl_shade(kl: float) -> int:
    """The shade of a token's KL: 0 below KL_BOUNDS[0], ... 4 from KL_BOUNDS[-1] on."""
    return bisect.bisect_right(KL_BOUNDS, kl)


def token_texts(pieces: Sequence[bytes]) -> list[str]:
    """Each token's text, its bytes decoded as they follow each other: a character split
    over two tokens is the second token's (the first's text is "")."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    texts = [decoder.decode(piece) for piece in pieces]
    if texts:
        texts[-1] += decoder.decode(b"", final=True)
    return texts


def legend() -> Content:
    parts: list[str | tuple[str, str]] = [("KL at each token (nats)  ", "bold")]
    edges = ("0", *(f"{b:g}" for b in KL_BOUNDS))
    for shade, low in enumerate(edges):
        high = f"-{edges[shade + 1]}" if shade + 1 < len(edges) else " and more"
        parts += [(" ", f"on {SHADE_COLOURS[shade]}"), f" {low}{high}  "]
    parts.append((f"(underlined: the top choices differ; {FIRST_MARK} the first of them)", "dim"))
    return Content.assemble(*parts)


def summary_line(d: Divergence) -> Content:
    """KL mean, p99 and max (at which token), top-1 agreement, the first divergence;
    over a top k, what the KL is."""
    first = "none" if d.first_divergence is None else f"token {d.first_divergence + 1}"
    said = (
        f"{d.positions:,} tokens · KL mean {d.kl_mean:.4f}, p99 {d.kl_p99:.4f}, max "
        f"{d.kl_max:.4f} at token {d.kl_max_at + 1} · top-1 agreement "
        f"{d.top1_agreement:.1%} · first divergence {first}"
    )
    return Content(f"{said} · {d.bound}" if d.bound else said)


def shaded_answer(pieces: Sequence[bytes], d: Divergence) -> Content:
    """A's answer, each token shaded by B's KL from A at it; a very long answer's middle
    is left out (clip.py), with a line that says so."""
    parts: list[tuple[str, str]] = []
    for i, text in enumerate(token_texts(pieces[: d.positions])):
        if i == d.first_divergence:
            parts.append((FIRST_MARK, "bold $error"))
        style = f"on {SHADE_COLOURS[kl_shade(d.kl[i])]}"
        if not d.agree[i]:
            style += " underline"
        parts.append((visible_controls(text), style))
    return clipped(Content.assemble(*parts))


def floor_line(f: Divergence) -> Content:
    """The engine's floor (A against itself read a token a step), in one line."""
    return Content(
        f"floor, A against itself read a token a step: KL mean {f.kl_mean:.4f}, max "
        f"{f.kl_max:.4f} · top-1 agreement {f.top1_agreement:.1%} (what the order of the "
        "sums alone moves)"
    )


class DivergenceView(ReportScreen):
    """B's divergence from A over A's answer; Esc (or `d`) closes it, and stops the
    teacher forcing if it still runs; `f` (A the model here) measures the engine's
    floor beside it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "dismiss", "Close", show=False),
        Binding("f", "floor", "Floor"),
    ]

    def __init__(
        self,
        title: str,
        sides: tuple[Backend, Backend],
        readers: tuple[Reader, Reader],
        messages: tuple[Message, ...],
        answer: tuple[str, AnswerTokens | None],
        measured: tuple[Teaching, Divergence] | None = None,
    ) -> None:
        """`messages`: what A's answer answered; `answer`: its text and, from the model
        here, its tokens; `measured`: a sequence and its divergence to draw instead of
        measuring one."""
        super().__init__()
        self.title_text, self.sides, self.readers = title, sides, readers
        self.messages, (self.text, self.tokens) = messages, answer
        self.stop = threading.Event()
        self.taught: Teaching | None = measured[0] if measured is not None else None
        self.divergence: Divergence | None = measured[1] if measured is not None else None
        #: what the view says while it measures, then why it could not (None: measured)
        self.status = "reading the prompt through A's template"
        #: the engine's floor, once `f` measured it; what `f` says while it measures
        self.floor: Divergence | None = None
        self.floor_status = ""

    def head(self) -> Content:
        lines = [Content.styled(self.title_text, "bold")]
        d = self.divergence
        if d is None:
            lines.append(Content(self.status))
        else:
            lines += [legend(), summary_line(d)]
            lines += [Content.styled(c, "dim") for c in caveats(self.readers)]
        if self.floor is not None:
            lines.append(floor_line(self.floor))
        elif self.floor_status:
            lines.append(Content(self.floor_status))
        return Content("\n").join(lines)

    def body(self) -> Content:
        if self.divergence is not None and self.taught is not None:
            return shaded_answer(self.taught.pieces, self.divergence)
        if self.tokens is not None:
            return Content.assemble(*(visible_controls(t) for t in token_texts(self.tokens.pieces)))
        return Content(visible_controls(self.text))

    def on_mount(self) -> None:
        if self.divergence is None:
            self.measure()

    def _redraw(self) -> None:
        self.query_one("#head", Static).update(self.head())
        self.query_one("#text", Static).update(self.body())

    def _progress(self, side: str, read: int, total: int) -> None:
        if not self.is_mounted or self.divergence is not None:
            return
        name = self.readers[side == "B"].name
        self.status = (
            f"side {side} ({name}) reads the answer, teacher-forced: {read:,} of {total:,} tokens"
        )
        self.query_one("#head", Static).update(self.head())

    @work(exclusive=True, group="divergence")
    async def measure(self) -> None:
        try:
            self.divergence, why = await self._measured()
        except Stopped:
            return
        except (OSError, ValueError, RuntimeError) as exc:  # a file gone, llama.cpp's load
            self.divergence, why = None, str(exc)
        if why is not None:
            self.status = f"no divergence: {why}"
        self._redraw()
        self.refresh_bindings()  # `f` once there is a sequence to read again

    async def _measured(self) -> tuple[Divergence | None, str | None]:
        """The divergence, or None and why not."""
        a, b = self.readers
        if (why := await vocabulary_check(a, b, None)) is not None:
            return None, why
        try:
            self.taught = await teaching(a, self.sides[0], self.messages, self.text, self.tokens)
        except ValueError as exc:  # a server's refusal (TeacherError) included
            return None, str(exc)
        self.status = f"side A ({a.name}) reads the answer, teacher-forced"
        self._redraw()
        told = self._from_thread(self._progress)
        return await forced_sides.measure(a, b, self.taught, told, self.stop)

    def _from_thread(
        self, shown: Callable[[str, int, int], None]
    ) -> Callable[[str, int, int], None]:
        """`shown` as a worker thread may call it: on the app's loop, never waited for (a
        view closed meanwhile has no loop to wait on)."""
        loop = asyncio.get_running_loop()

        def told(side: str, read: int, total: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(shown, side, read, total)

        return told

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "floor":  # A's sequence read again here, a token a step
            return self.readers[0].whole and self.taught is not None and self.floor is None
        return True

    @work(exclusive=True, group="floor")
    async def action_floor(self) -> None:
        """A against itself, read a token a step: what arithmetic alone moves."""
        if self.taught is None or self.floor is not None:
            return
        told = self._from_thread(self._floor_progress)
        self.floor_status = "floor: reading A's answer again"
        self._redraw()
        try:
            self.floor = await asyncio.to_thread(
                forced_sides.floor, self.readers[0], self.taught, told, self.stop
            )
        except Stopped:
            return
        except (OSError, ValueError, RuntimeError) as exc:
            self.floor_status = f"no floor: {exc}"
        if self.is_mounted:
            self._redraw()
            self.refresh_bindings()

    def _floor_progress(self, side: str, read: int, total: int) -> None:
        if not self.is_mounted or self.floor is not None:
            return
        self.floor_status = f"floor: {side} reads the answer, {read:,} of {total:,} tokens"
        self.query_one("#head", Static).update(self.head())

    def on_unmount(self) -> None:
        self.stop.set()  # the worker thread stops at its next batch
