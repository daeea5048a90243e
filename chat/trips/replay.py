"""Replaying a scripted chat: what prefill cost on each turn, as a user would meet it.

A script is JSON: {"system": "...", "turns": ["...", ...], "max_tokens": 64}. Each turn is
sent through a real `TurnController` (the trimmer included unless switched off), so the
figures are the ones a user of the chat would meet: prompt tokens, how many came from
the engine's prefix cache, how many were evaluated, TTFT, decode rate, and whether the
turn was the first with a new history summary.

With `concurrency` N (remote backends) N copies of the chat run in lockstep, each
turn's N requests at once, and the totals give the aggregate output rate the server
sustained. `phasechat bench` is the command line over this module.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phasechat.backends.base import Backend
from phasechat.chat.config.settings import Settings
from phasechat.chat.trim.summarize import Summary
from phasechat.chat.turns import TurnController
from phasechat.chat.user_file import read_user_file
from phasechat.telemetry.metric_set import Metrics, TimingFigures, TokenFigures, flat

#: the largest script read (a long chat of long turns is a few MB)
MAX_SCRIPT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Script:
    """A scripted conversation."""

    system: str
    turns: tuple[str, ...]
    max_tokens: int | None = None


def load_script(path: Path) -> Script:
    """Read and check a script; ValueError with one line on anything wrong."""
    try:
        data = json.loads(read_user_file(path, MAX_SCRIPT_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    except ValueError as exc:  # a JSONDecodeError, or an integer of 5,000 digits
        raise ValueError(f"{path} is not JSON: {exc}") from None
    except RecursionError:  # the json module recurses once per level of nesting
        raise ValueError(f"{path} is not a script: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object with 'system' and 'turns'")
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{path}: 'turns' must be a non-empty list of strings")
    if not all(t.strip() for t in turns):
        raise ValueError(f"{path}: a turn is empty")
    system = data.get("system", "")
    if not isinstance(system, str):
        raise ValueError(f"{path}: 'system' must be a string")
    max_tokens = data.get("max_tokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise ValueError(f"{path}: 'max_tokens' must be a whole number")
        for _, problem in Settings(max_tokens=max_tokens).problems():
            raise ValueError(f"{path}: 'max_tokens' {max_tokens}: {problem}")
    return Script(system, tuple(turns), max_tokens)


@dataclass(frozen=True, slots=True)
class TurnRow:
    """One turn of one copy of the chat, as measured: the answer's metric set, its
    token counts as the turn met them (`tokens`: a request refused before its prefill
    cached and evaluated nothing), and the turn's own figures."""

    turn: int
    copy: int
    tokens: TokenFigures
    trimmed: bool
    tokens_cut: int
    trim_wait_ms: float | None
    trim_note: str | None
    error: str | None
    #: every metric of the answer, as `ask --json` prints them (warnings included)
    metrics: Metrics = field(repr=False)

    @property
    def timing(self) -> TimingFigures:
        """The answer's times and rates."""
        return self.metrics.timing

    def record(self) -> dict[str, Any]:
        """The turn as one JSON-ready object: every metric, then the turn's own fields
        (which win where they differ: a refused request evaluated nothing)."""
        own = {"turn": self.turn, "copy": self.copy, **flat(self.tokens)}
        turn = {"trimmed": self.trimmed, "tokens_cut": self.tokens_cut}
        trim = {"trim_wait_ms": self.trim_wait_ms, "trim_note": self.trim_note}
        return {
            "type": "turn",
            **self.metrics.as_dict(),
            **own,
            **turn,
            **trim,
            "error": self.error,
        }

    def line(self) -> str:
        """The human line: turn, prompt, cached, evaluated, TTFT, decode rate, trimmed."""
        copy = f"/{self.copy}" if self.copy else ""
        t, time = self.tokens, self.timing
        text = (
            f"turn {self.turn:>3}{copy}  prompt {_n(t.prompt_tokens):>6}  "
            f"cached {_n(t.cached_tokens):>6}  evaluated {_n(t.evaluated_prompt_tokens):>6}"
            f"  ttft {_f(time.ttft_ms, 0):>7} ms  decode {_f(time.decode_tok_s, 1):>6} tok/s"
            f"  trimmed {'yes' if self.trimmed else 'no'}"
        )
        extra = [x for x in (self.trim_note, self.error) if x]
        return text + ("  · " + " · ".join(extra) if extra else "")


@dataclass
class BenchResult:
    """Every row of a replay, its wall time and the summaries written on the way."""

    rows: list[TurnRow] = field(default_factory=list)
    wall_s: float = 0.0
    summaries: list[Summary] = field(default_factory=list)

    def totals(self) -> dict[str, Any]:
        """The figures of the summary line."""
        rows = self.rows
        ok = [r for r in rows if r.error is None]
        prompt = sum(r.tokens.prompt_tokens or 0 for r in ok)
        cached = sum(r.tokens.cached_tokens or 0 for r in ok)
        ttfts = sorted(r.timing.ttft_ms for r in ok if r.timing.ttft_ms is not None)
        output = sum(r.tokens.output_tokens for r in ok)
        return {
            "type": "summary",
            "turns": len(rows),
            "errors": len(rows) - len(ok),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "cached_share": cached / prompt if prompt else None,
            "evaluated_prompt_tokens": sum(r.tokens.evaluated_prompt_tokens or 0 for r in ok),
            "ttft_ms_mean": sum(ttfts) / len(ttfts) if ttfts else None,
            "ttft_ms_max": ttfts[-1] if ttfts else None,
            "trims": sum(r.trimmed for r in rows),
            "trim_wait_ms": sum(r.trim_wait_ms or 0.0 for r in rows),
            "summaries": len(self.summaries),
            "summary_ms": sum(s.metrics.e2e_ms or 0.0 for s in self.summaries),
            "summary_output_tokens": sum(s.metrics.output_tokens for s in self.summaries),
            "output_tokens": output,
            "wall_s": self.wall_s,
            "output_tok_s": output / self.wall_s if self.wall_s else None,
        }

    def summary_line(self) -> str:
        """Totals in one line."""
        t = self.totals()
        share = f" ({t['cached_share']:.0%})" if t["cached_share"] is not None else ""
        return (
            f"total: {t['turns']} turns, {t['errors']} errors · prompt {t['prompt_tokens']:,}"
            f" · cached {t['cached_tokens']:,}{share} · evaluated "
            f"{t['evaluated_prompt_tokens']:,} · ttft mean {_f(t['ttft_ms_mean'], 0)} ms, max "
            f"{_f(t['ttft_ms_max'], 0)} ms · {t['trims']} trims, {t['summaries']} summaries "
            f"({t['summary_ms'] / 1000:.1f} s, waited {t['trim_wait_ms'] / 1000:.1f} s) · "
            f"output {t['output_tokens']:,} tokens in {t['wall_s']:.1f} s = "
            f"{_f(t['output_tok_s'], 1)} tok/s aggregate"
        )


async def replay(
    backend: Backend,
    script: Script,
    settings: Settings,
    *,
    trim: bool = True,
    concurrency: int = 1,
    configure: Callable[[TurnController], Backend | None] | None = None,
    on_row: Callable[[TurnRow], None] | None = None,
    think_time_s: float = 0.0,
) -> BenchResult:
    """Send every turn of `script` through `concurrency` users (a turn controller each)
    on a started backend.

    `configure` sets each user's trimmer as the app would (`Workspace.
    configure_trimmer`) and returns a summarizer backend still to be started; `trim=False`
    then turns trimming off whatever it said."""
    users = [TurnController(backend, replace(settings, system=script.system))]
    users += [TurnController(backend, users[0].settings) for _ in range(concurrency - 1)]
    for s in users:
        summarizer = configure(s) if configure is not None else None
        if summarizer is not None:
            await summarizer.start()
        if not trim:
            s.set_trim(False)
    result = BenchResult()
    t0 = time.perf_counter()
    try:
        for turn, prompt in enumerate(script.turns, 1):
            if turn > 1 and think_time_s:
                # The user reads the answer and types: background work (a summary, the
                # pre-fill of the trimmed prompt) runs meanwhile, as in the app.
                await asyncio.sleep(think_time_s)
            rows = await asyncio.gather(*(_turn(s, prompt, turn, i) for i, s in enumerate(users)))
            for row in rows:
                result.rows.append(row)
                if on_row is not None:
                    on_row(row)
    finally:
        # the user's think time is not the server's: left out of the aggregate rate
        result.wall_s = time.perf_counter() - t0 - think_time_s * (len(script.turns) - 1)
        for s in users:
            await s.aclose()
            result.summaries.extend(s.trimmer.summaries)
    return result


async def _turn(turns: TurnController, prompt: str, turn: int, copy: int) -> TurnRow:
    await turns.send(prompt)
    e = turns.exchanges[-1]
    m = e.metrics
    assert m is not None
    # A request refused before prefill (context overflow) evaluated nothing; the metrics'
    # fallback to our own prompt count would read as a full prefill.
    refused = m.ttft_ms is None and e.answer.status == "error"
    return TurnRow(
        turn=turn,
        copy=copy,
        tokens=replace(m.tokens, cached_tokens=None, evaluated_prompt_tokens=None)
        if refused
        else m.tokens,
        trimmed=e.trimmed,
        tokens_cut=e.tokens_cut,
        trim_wait_ms=e.trim_wait_ms,
        trim_note=e.trim_note,
        error=e.answer.error,
        metrics=m,
    )


def _n(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _f(v: float | None, digits: int) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:,.{digits}f}"
