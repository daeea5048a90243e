"""Rendering telemetry as Textual `Content`: numbers in, styled text out.

Colours are theme variables only; data never passes through markup parsing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.content import Content

from phasechat.backends.base import Backend
from phasechat.backends.events import KVStats
from phasechat.chat.costs import Expected, SwitchCost
from phasechat.chat.engine_held import name_of
from phasechat.chat.text import one_line
from phasechat.chat.trim.trimmer import TrimStats
from phasechat.chat.turns import Exchange
from phasechat.telemetry.anatomy import Anatomy
from phasechat.telemetry.forecast import Forecast
from phasechat.telemetry.live import Live
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.verdict import engine_account
from phasechat.telemetry.waterfall import waterfall_of

SPARKS = "▁▂▃▄▅▆▇█"


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    """A number for humans, '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def rate_text(rate: float | None, burst: str | None, unit: str = "tok", approx: str = "") -> str:
    """A decode rate for a line of figures; a burst's is no rate ("burst: no tok/s"),
    its reason shown on a line of its own."""
    return f"burst: no {unit}/s" if burst else f"{approx}{fmt(rate)} {unit}/s"


def status_content(backend: Backend, generating: bool, last: Metrics | None) -> Content:
    """The status line: backend, model, state, and the last answer's headline figures."""
    state = "streaming" if generating else backend.state
    tail = ""
    if last is not None:
        rate = rate_text(last.decode_tok_s, last.decode_unknown)
        tail = f"  ·  last: TTFT {fmt(last.ttft_ms, ' ms', 0)}, {rate}"
    style = {"failed": "$error", "loading": "$warning", "streaming": "$accent"}.get(
        state, "$success"
    )
    # The model id and the failure detail come from a server: drawn as inert text.
    detail = f" · {one_line(backend.state_detail)}" if backend.state == "failed" else ""
    return Content.assemble(
        (f" {one_line(backend.name)}", "bold"),
        f" · {one_line(backend.model)} · ",
        (state, style),
        (detail, "$error"),
        tail,
    )


def switch_line(cost: SwitchCost) -> str:
    """One line: the history's size on a switch target and its measured re-prefill time."""
    head = f"history {'~' if cost.estimated else ''}{cost.tokens:,} tokens"
    if cost.active:
        return head + " · active"
    seconds = cost.reprefill_s
    if seconds is None:
        return head + " · re-prefill time unknown (not measured yet)"
    rate = fmt(cost.rates.prefill_tok_s)
    return f"{head} · re-prefill ≈ {fmt(seconds, ' s', 1)} at {rate} tok/s"


def sparkline(values: tuple[float, ...] | list[float], width: int = 40) -> str:
    """Block characters scaled to the largest of the last `width` values."""
    vals = list(values)[-width:]
    if not vals:
        return ""
    top = max(vals) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1)))] for v in vals)


def phase_bar(
    prefill_ms: float | None,
    total_ms: float | None,
    width: int = 30,
    thinking_ms: float | None = None,
    load_ms: float | None = None,
) -> Content:
    """`prefill | decode` (or `prefill | thinking | answer` for a model that thinks) as
    coloured runs proportional to their share of the time; `prefill_ms` is the TTFT,
    and the part of it spent waiting for the model to load (`load_ms`) is a run of its
    own in front (`load | prefill | ...`)."""
    if not total_ms or prefill_ms is None:
        return Content("")
    waited = min(load_ms or 0.0, prefill_ms)
    load = round(width * min(1.0, waited / total_ms)) if waited else 0
    pre = max(1, round(width * min(1.0, prefill_ms / total_ms)) - load)
    head: list[tuple[str, str]] = [("█" * load, "$secondary")] if load else []
    names = "load | prefill" if load else "prefill"
    if thinking_ms is None:
        return Content.assemble(
            *head,
            ("█" * pre, "$phase-prefill"),
            ("█" * max(0, width - load - pre), "$phase-decode"),
            (f" {names} | decode", "dim"),
        )
    think = min(max(0, width - load - pre), max(1, round(width * thinking_ms / total_ms)))
    return Content.assemble(
        *head,
        ("█" * pre, "$phase-prefill"),
        ("█" * think, "$phase-thinking"),
        ("█" * max(0, width - load - pre - think), "$phase-decode"),
        (f" {names} | thinking | answer", "dim"),
    )


def thinking_title(live: Live) -> str:
    """The folded thinking block's title: how long the model thought, in how many tokens."""
    running = "…" if live.phase == "thinking" else ""
    approx = "~" if live.tokens_estimated else ""
    seconds = fmt((live.reasoning_ms or 0) / 1000, " s", 1)
    return f"thinking{running} {seconds} · {approx}{live.reasoning_tokens:,} tokens"


#: How much each line of the panel matters (0 most): when its rows run out, the lines
#: of the highest ranks are left out first. While editing, the edit's forecast comes
#: first; after a turn, a break of the engine's cache before the rates.
RANK = {
    "edit": 0,
    "break": 1,
    "headline": 2,
    "forecast": 3,
    "warning": 4,
    "anatomy": 5,
    "gauge": 6,
    "trim": 7,
    "threads": 8,
    "phases": 9,
    "itl": 10,
    "engine": 11,
}


@dataclass(frozen=True, slots=True)
class PanelLine:
    """One line the panel means to say (it may wrap to more rows), and its rank."""

    content: Content
    rank: int


def live_lines(live: Live, kv: KVStats | None = None, section: str = "") -> list[PanelLine]:
    """The live panel's lines while a request runs (and just after), ranked: the
    headline (the phase and its figures), the gaps between tokens, the phase bar, the KV
    cache; `section`: the part of the prompt a long prefill is reading now."""
    parts: list[str | tuple[str, str] | Content] = []
    load = live.load_ms
    if live.phase == "summary":
        parts += [
            ("waiting for the history summary", "bold $phase-prefill"),
            f"   {fmt(live.elapsed_ms / 1000, ' s', 1)}…  (not sent yet: not in TTFT)",
        ]
    elif live.phase == "loading":
        parts += [
            ("loading the model", "bold $secondary"),
            f"   TTFT {fmt(live.elapsed_ms / 1000, ' s', 2)}…",
            ("   this answer waits for it: in TTFT, not prefill", "dim"),
        ]
    elif live.phase in ("waiting", "prefill"):
        prompt = f"{live.prompt_tokens:,} tokens" if live.prompt_tokens else "the prompt"
        progress = ""
        if live.prefill_done is not None and live.prompt_tokens:
            progress = f" ({live.prefill_done:,}/{live.prompt_tokens:,})"
        parts += [
            (f"prefilling {prompt}{progress}", "bold $phase-prefill"),
            (f": reading {section}" if section and progress else "", "$phase-prefill"),
            f"   TTFT {fmt(live.elapsed_ms / 1000, ' s', 2)}…",
            (f" (load {fmt(load / 1000, ' s', 1)})" if load else "", "dim"),
        ]
        if live.prefill_left_ms is not None:
            parts.append(f"   ≈ {fmt(live.prefill_left_ms / 1000, ' s', 1)} left")
        if live.cached_tokens:
            parts.append(f"   cached prefix {live.cached_tokens:,}")
    elif live.phase == "thinking":
        approx = "~" if live.tokens_estimated else ""
        unit = "tok" if live.unit == "tokens" else "chunks"
        parts += [
            ("thinking", "bold $phase-thinking"),
            f"   TTFT {fmt(live.ttft_ms, ' ms', 0)}",
            (f" (load {fmt(load, ' ms', 0)})" if load else "", "dim"),
            f"   thought {fmt((live.reasoning_ms or 0) / 1000, ' s', 1)}…",
            "   ",
            (rate_text(live.decode_tok_s, live.decode_unknown, unit, approx), "bold $accent"),
            f"   {approx}{live.reasoning_tokens:,} thinking {live.unit}",
        ]
    else:
        approx = "~" if live.tokens_estimated else ""
        unit = "tok" if live.unit == "tokens" else "chunks"
        label = "decoding"
        if live.reasoning_ms is not None:  # the answer of a model that thought first
            parts.append(f"thought {fmt(live.reasoning_ms / 1000, ' s', 1)}   ")
            label = "answering"
        parts += [
            (label if live.phase == "decode" else "done", "bold $phase-decode"),
            f"   TTFT {fmt(live.ttft_ms, ' ms', 0)}",
            (f" (load {fmt(load, ' ms', 0)})" if load else "", "dim"),
            "   ",
            (rate_text(live.decode_tok_s, live.decode_unknown, unit, approx), "bold $accent"),
            f"   {fmt(live.chars_per_s, ' chars/s', 0)}",
            f"   {approx}{live.tokens:,} {live.unit}",
        ]
        if live.cached_tokens:
            parts.append(f"   cached prefix {live.cached_tokens:,}")
    line2: list[str | tuple[str, str] | Content] = [
        ("ITL ", "dim"),
        (sparkline(live.recent_itl_ms), "$itl-spark"),
    ]
    if live.stall:
        since = fmt((live.since_last_ms or 0) / 1000, " s", 1)
        line2.append((f"  {live.stall}: no token for {since}", "bold $stall"))
    if live.decode_unknown:
        line2.append((f"  {one_line(live.decode_unknown)}", "$stall"))
    out = [
        PanelLine(Content.assemble(*parts), RANK["headline"]),
        PanelLine(Content.assemble(*line2), RANK["itl"]),
    ]
    if live.phase not in ("summary", "loading", "waiting") and live.ttft_ms is not None:
        bar = phase_bar(live.ttft_ms, live.elapsed_ms, thinking_ms=live.reasoning_ms, load_ms=load)
        out.append(PanelLine(bar, RANK["phases"]))
    if kv is not None:
        gauge = kv_gauge(kv.used_tokens, kv.capacity_tokens, kv.used_bytes)
        out.append(PanelLine(gauge, RANK["gauge"]))
    return out


def context_gauge(m: Metrics, width: int = 20) -> Content:
    """A server's window: what this chat holds of it (prompt + answer), and who said how
    large it is; or that the server does not say."""
    if m.context_window is None:
        why = m.context_source or "the server does not report it"
        return Content.assemble(("context ", "dim"), f"window unknown ({why}; --context N)")
    used = m.kv_used_tokens or 0
    frac = min(1.0, used / m.context_window)
    filled = round(frac * width)
    return Content.assemble(
        ("context ", "dim"),
        ("■" * filled, "$stall" if frac > 0.9 else "$kv-fill"),
        ("□" * (width - filled), "dim"),
        f" {used:,}/{m.context_window:,} tokens",
        (f" ({m.context_source})" if m.context_source else "", "dim"),
    )


def kv_gauge(used: int, capacity: int, used_bytes: int, width: int = 20) -> Content:
    """KV cache fill: a bar, tokens used / capacity, and MiB."""
    frac = used / capacity if capacity else 0.0
    filled = round(frac * width)
    style = "$stall" if frac > 0.9 else "$kv-fill"
    return Content.assemble(
        ("KV ", "dim"),
        ("■" * filled, style),
        ("□" * (width - filled), "dim"),
        f" {used:,}/{capacity:,} tokens · {used_bytes / 2**20:.1f} MiB",
    )


def answer_footer(
    m: Metrics, predicted: Forecast | None = None, trim_note: str | None = None
) -> Content:
    """One line under a finished answer: its phases at a glance; and one more for an
    answer that waited for the model to load, with its TTFT split."""
    approx = "~" if m.output_tokens_estimated else ""
    bits = [f"TTFT {fmt(m.ttft_ms, ' ms', 0)}"]
    if m.reasoning_tokens is not None or m.reasoning_ms is not None:
        approx_r = "~" if m.reasoning_tokens_source == "estimate" else ""
        bits.append(
            f"thought {fmt((m.reasoning_ms or 0) / 1000, ' s', 1)} "
            f"({approx_r}{m.reasoning_tokens or 0} tokens)"
        )
    bits += [
        rate_text(m.decode_tok_s, m.decode_unknown, approx=approx),
        f"{approx}{m.output_tokens} tokens",
        f"prompt {m.prompt_tokens if m.prompt_tokens is not None else '-'}"
        + (f" ({m.cached_tokens} cached)" if m.cached_tokens else ""),
        f"e2e {fmt((m.e2e_ms or 0) / 1000, ' s', 2)}",
    ]
    if predicted is not None and predicted.ttft_ms is not None:
        bits.append(f"predicted TTFT {fmt(predicted.ttft_ms, ' ms', 0)}")
    if m.finish and m.finish != "stop":
        bits.append(m.finish)
    if trim_note:
        bits.append(trim_note)
    line = Content(" · ".join(bits))
    if m.load_ms is None or m.ttft_ms is None:
        return line
    # The wait for the model, kept apart: the TTFT is the user's wait, split here.
    prefill = max(0.0, m.ttft_ms - m.load_ms)
    return Content.assemble(
        line,
        (
            f"\nload {fmt(m.load_ms, ' ms', 0)}: this answer waited for the model to load"
            f" (TTFT {fmt(m.ttft_ms, ' ms', 0)} = load {fmt(m.load_ms, ' ms', 0)}"
            f" + prefill {fmt(prefill, ' ms', 0)})",
            "dim",
        ),
    )


def engine_line(m: Metrics) -> Content:
    """The engine's own account beside ours, the roofline hint and the gaps between
    tokens (the disagreements: `warning_lines`)."""
    parts: list[str | tuple[str, str] | Content] = []
    label, figures = engine_account(m)
    if figures:
        parts += [(label, "dim"), one_line(figures)]
    if (wait := waterfall_of(m)) is not None:
        parts += [("   wait ", "dim"), one_line(wait.line())]
    if m.prefill_tok_s is None and not m.cache_reported and m.ttft_ms is not None:
        parts += [("   prefill ", "dim"), "n/a (server does not report its cache)"]
    if m.draft_acceptance is not None:
        parts += [
            ("   draft ", "dim"),
            f"{m.server_draft_accepted}/{m.server_draft_n} accepted ({m.draft_acceptance:.0%})",
        ]
    if m.implied_bandwidth_gb_s is not None:
        parts += [("   roofline ", "dim"), f"≈ {m.implied_bandwidth_gb_s:.2f} GB/s effective"]
    if m.itl_ms_p50 is not None:
        parts += [
            ("   ITL ", "dim"),
            f"p50 {fmt(m.itl_ms_p50)} p95 {fmt(m.itl_ms_p95)} p99 {fmt(m.itl_ms_p99)} "
            f"max {fmt(m.itl_ms_max)} ms",
        ]
    return Content.assemble(*parts)


def warning_lines(m: Metrics) -> list[Content]:
    """One line per disagreement between the server's figures and ours."""
    return [Content.styled(f"⚠ {one_line(w)}", "$stall") for w in m.warnings]


def edit_forecast_line(expected: Expected, system: bool) -> Content:
    """What the edit in the prompt box will cost: what the engine keeps, what it reads
    again, the TTFT that implies (a system prompt's edit re-reads the whole chat)."""
    return Content.assemble(
        ("edit ", "dim"),
        ("a new system prompt re-reads the whole chat: ", "$phase-prefill") if system else "",
        expected.line(),
    )


def forecast_line(f: Forecast, actual: Metrics | None = None) -> Content:
    """What the draft will cost: new vs cached prompt tokens, TTFT, total at max_tokens."""
    approx = "~" if f.estimated_tokens else ""
    head = f"forecast: {approx}{f.new_tokens:,} new + {f.cached_tokens:,} cached prompt tokens"
    if f.ttft_ms is None:
        return Content.assemble(("forecast ", "dim"), head[10:], ("  (not measured yet)", "dim"))
    total = f"  ≤ {fmt((f.total_ms or 0) / 1000, ' s', 1)} with {f.max_tokens} tokens"
    parts: list[str | tuple[str, str]] = [
        ("forecast ", "dim"),
        head[10:],
        " → TTFT ≈ ",
        (fmt(f.ttft_ms, " ms", 0), "bold $phase-prefill"),
        (f" ({fmt(f.overhead_ms, ' ms', 0)} fixed + {fmt(f.prefill_ms, ' ms', 0)} prefill)", "dim")
        if f.overhead_ms
        else "",
        total if f.total_ms else "",
    ]
    if actual is not None:
        parts.append((f"   actual TTFT {fmt(actual.ttft_ms, ' ms', 0)}", "$phase-decode"))
    return Content.assemble(*parts)


def trim_line(t: TrimStats) -> Content:
    """The history trimmer at a glance: what it cut, what that saved, what it cost."""
    if not t.enabled:
        return Content.assemble(("trim ", "dim"), "off")
    approx = "~" if t.estimated else ""
    parts: list[str | tuple[str, str]] = [
        ("trim ", "dim"),
        f"budget {approx}{t.budget:,}",
        f" · {t.summarized_messages} messages summarized" if t.summaries else " · nothing cut yet",
    ]
    if t.tokens_cut_total:
        parts.append(f" · cut {approx}{t.tokens_cut_total:,} prompt tokens")
        if t.prefill_s_saved is not None:
            parts.append(f" (≈ {fmt(t.prefill_s_saved, ' s', 1)} of cold prefill)")
    if t.summaries:
        parts.append(f" · summaries cost {fmt(t.summary_ms_total / 1000, ' s', 1)}")
    if t.summary_kind == "extractive":
        parts.append((f" · extractive summary ({t.summary_why})", "$warning"))
    elif t.summary_kind == "model":
        parts.append((" · model-written summary", "dim"))
    if t.pending:
        parts.append((" · summarizing…", "$phase-prefill"))
    if t.last_error:
        parts.append((f" · {one_line(t.last_error)}", "$stall"))
    return Content.assemble(*parts)


#: each kind of prompt section's colour in the stacked bar and the prompt view
SECTION_STYLE = {
    "template": "$text-muted",
    "system": "$accent",
    "summary": "$warning",
    "history": "$phase-prefill",
    "new": "$phase-decode",
}


def section_widths(anatomy: Anatomy, width: int) -> list[int]:
    """Each section's share of `width` cells, by its tokens (one at least, if it has any)."""
    total = anatomy.prompt_tokens or 1
    widths = [max(1, round(s.tokens * width / total)) if s.tokens else 0 for s in anatomy.sections]
    while sum(widths) > width and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths


def anatomy_line(anatomy: Anatomy, width: int = 40, hint: str = "  (F8: the prompt)") -> Content:
    """The prompt as a stacked bar, one colour per section, each cached part light (░)
    and its read part solid (█); then the sections the prefill paid most for."""
    parts: list[str | tuple[str, str]] = [("prompt ", "dim")]
    for section, cells in zip(anatomy.sections, section_widths(anatomy, width), strict=True):
        style = SECTION_STYLE[section.kind]
        cached = section.cached_tokens
        light = round(cells * cached / section.tokens) if cached and section.tokens else 0
        parts += [("░" * light, style), ("█" * (cells - light), style)]
    approx = "~" if anatomy.source == "estimate" else ""
    reading = sorted(
        (s for s in anatomy.sections if s.evaluated_tokens),
        key=lambda s: -(s.evaluated_tokens or 0),
    )
    read = sum(s.evaluated_tokens or 0 for s in anatomy.sections)
    if anatomy.sections and anatomy.sections[0].cached_tokens is None:
        parts.append((f"  {approx}{anatomy.prompt_tokens:,} tokens, cache not reported", "dim"))
    elif read:
        share = ", ".join(
            f"{name_of(s.kind, s.message_index)} {100 * (s.evaluated_tokens or 0) / read:.0f}%"
            for s in reading[:3]
        )
        parts.append(f"  read {approx}{read:,} of {approx}{anatomy.prompt_tokens:,}: {share}")
    parts.append((hint, "dim"))
    return Content.assemble(*parts)


def panel_lines(
    exchange: Exchange, forecast: Content | None, trim: TrimStats | None, editing: bool = False
) -> list[PanelLine]:
    """Every line of the live panel for `exchange`, in the order shown: its live figures;
    once it is over (a `forecast` of the draft, or of the edit while `editing`, is given
    then), the engine's account, a server's window, the prompt's bar, a cache break and
    the forecast; the trimmer's line when it has done something."""
    live = exchange.live()
    section = exchange.prefill_section() if live.phase == "prefill" else ""
    lines = live_lines(live, exchange.kv, section)
    lines.append(PanelLine(Content(live.threads_note), RANK["threads"]))
    if forecast is not None:
        if (m := exchange.metrics) is not None:
            if exchange.kv is None:  # a server: its window instead of the KV cache
                lines.append(PanelLine(context_gauge(m), RANK["gauge"]))
            lines.append(PanelLine(engine_line(m), RANK["engine"]))
            lines += [PanelLine(w, RANK["warning"]) for w in warning_lines(m)]
        if (anatomy := exchange.anatomy) is not None and anatomy.sections:
            lines.append(PanelLine(anatomy_line(anatomy), RANK["anatomy"]))
            if (brk := anatomy.cache_break) is not None:
                warn = Content.styled(f"⚠ {one_line(brk.line())}", "$warning")
                lines.append(PanelLine(warn, RANK["break"]))
        lines.append(PanelLine(forecast, RANK["edit" if editing else "forecast"]))
    if trim is not None:
        lines.append(PanelLine(trim_line(trim), RANK["trim"]))
    return [line for line in lines if line.content]


def fit_lines(lines: Sequence[PanelLine], width: int, height: int) -> Content:
    """The lines that fit `height` rows of `width` cells, each whole (wrapped as drawn),
    in their order: the most important first (lowest rank, then the earlier), then each
    next one that still fits. Before the panel has a size: every line."""
    if width <= 0 or height <= 0:
        return Content("\n").join(line.content for line in lines)
    rows = [max(1, len(line.content.wrap(width))) for line in lines]
    kept: set[int] = set()
    left = height
    for i in sorted(range(len(lines)), key=lambda i: (lines[i].rank, i)):
        if rows[i] <= left:
            kept.add(i)
            left -= rows[i]
    return Content("\n").join(line.content for i, line in enumerate(lines) if i in kept)
