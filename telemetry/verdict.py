"""Reading the meter for the user: after an answer, which phase ate the wall time, the
knob that moves it, and how close decode ran to what memory allows.

Pure: a `Metrics` and this machine's measured memory bandwidth in, one line out. The
phases split the answer's wall time (request sent -> last token): load is the wait for
the model to load (an answer sent while it loaded), prefill the rest of the wait for
the first token (TTFT: queueing and the network included), thinking is the first
thinking token -> first answer token, decode is the rest. The phase with the largest
share names the verdict: a load is never called prefill.

The roofline: a decode step reads every weight and the KV cache so far, so memory
allows at most bandwidth / (weight bytes + KV bytes) tokens per second, and
`implied_bandwidth_gb_s` (decode tok/s x those bytes) over the measured bandwidth is
the share of that limit decode reached. It needs the weights' size, which only the
local backend knows; for a server it is "unknown".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from phasechat.telemetry.metrics import Metrics

KNOBS = {
    "prefill": "a shorter prompt, a stable prefix the engine can cache, or trimming the history",
    "decode": "smaller or more quantized weights, or a lower max_tokens",
    "thinking": "less thinking (a lower reasoning effort or a non-thinking mode), "
    "or a lower max_tokens",
    # not a knob to try: the wait is over once the model is loaded (Verdict.line)
    "load": "the model was still loading when this was sent: it loads once, the next "
    "answers do not wait for it (a smaller model file loads sooner)",
}

#: A prompt whose cached share is below this, with prefill the largest phase, gets the
#: cache named first: reusing the prefix is the cheapest cut.
LOW_CACHE_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Verdict:
    """The phase that ate the time, every phase's share, the knob and the roofline."""

    phase: str
    shares: tuple[tuple[str, float], ...]
    knob: str
    roofline: str
    #: a remote answer: how its TTFT splits between the server's prefill and the rest
    transport: str = ""

    def line(self) -> str:
        """One line: `decode-bound (decode 78% · prefill 22%): try ... · decode runs at ...`"""
        shares = " · ".join(f"{name} {share:.0%}" for name, share in self.shares)
        tail = f" · {self.transport}" if self.transport else ""
        knob = self.knob if self.phase == "load" else f"try {self.knob}"
        return f"{self.phase}-bound ({shares}): {knob} · {self.roofline}{tail}"


def phase_shares(m: Metrics) -> tuple[tuple[str, float], ...] | None:
    """(phase, share of the wall time), largest first; None without a TTFT and e2e."""
    if m.ttft_ms is None or not m.e2e_ms or m.e2e_ms <= 0:
        return None
    total = m.e2e_ms
    ttft = min(m.ttft_ms, total)
    load = min(m.load_ms or 0.0, ttft)
    prefill = ttft - load
    thinking = 0.0
    if m.reasoning_ms is not None and m.reasoning_tokens:
        thinking = max(0.0, min(m.reasoning_ms, total - ttft))
    decode = max(0.0, total - ttft - thinking)
    parts = [("prefill", prefill), ("decode", decode)]
    if thinking:
        parts.append(("thinking", thinking))
    if load:
        parts.append(("load", load))
    ordered = sorted(parts, key=lambda p: -p[1])
    return tuple((name, ms / total) for name, ms in ordered)


def roofline(m: Metrics, bandwidth_gb_s: float | None, label: str = "") -> str:
    """`decode runs at N% of what memory allows (X of Y GB/s)`, or why it is unknown.
    `label`: how far to trust the bandwidth (e.g. "probed on a busy machine")."""
    if m.implied_bandwidth_gb_s is None:
        if m.decode_tok_s is None:
            return "roofline: no decode rate (fewer than two tokens)"
        return "roofline unknown: the weights' size is not known for this backend"
    if bandwidth_gb_s is None or not 0 < bandwidth_gb_s < math.inf:  # NaN fails too
        return "roofline unknown: this machine's memory bandwidth is not measured"
    share = m.implied_bandwidth_gb_s / bandwidth_gb_s
    of = f"{m.implied_bandwidth_gb_s:.1f} of {bandwidth_gb_s:.1f} GB/s"
    return f"decode runs at {share:.0%} of what memory allows ({of}{label and ', ' + label})"


def knob(phase: str, m: Metrics) -> str:
    """The knob for `phase`, made specific where the figures say which part applies."""
    cached, prompt, block = m.cached_tokens, m.prompt_tokens, m.server_kv_block_tokens
    if phase == "prefill" and prompt and block and prompt < block:
        # the server caches whole blocks: a prompt shorter than one is never cached
        return (
            f"a shorter prompt: this server caches whole blocks of {block:,} tokens, "
            f"and a {prompt:,}-token prompt fills none, so a stable prefix cannot help"
        )
    if phase == "prefill" and prompt and cached is not None and cached / prompt < LOW_CACHE_SHARE:
        return (
            f"a stable prefix the engine can cache ({cached:,} of {prompt:,} prompt tokens "
            "were cached), a shorter prompt, or trimming the history"
        )
    if phase in ("decode", "thinking") and m.finish == "length":
        return "a lower max_tokens (the answer stopped at it), " + KNOBS[phase].split(", or")[0]
    return KNOBS[phase]


def verdict(
    m: Metrics, bandwidth_gb_s: float | None = None, bandwidth_label: str = ""
) -> Verdict | None:
    """The verdict on one finished answer; None when it has no timing to judge (a request
    that failed before its first token). `bandwidth_label`: see `roofline`."""
    shares = phase_shares(m)
    if shares is None:
        return None
    phase = shares[0][0]
    return Verdict(
        phase, shares, knob(phase, m), roofline(m, bandwidth_gb_s, bandwidth_label), transport(m)
    )


def transport(m: Metrics) -> str:
    """A remote answer's TTFT, split: the server's own time to first token, queue and
    prefill and the transport's share (vLLM's /metrics), or the server's own prefill
    (llama-server's `prompt_ms`) and the rest (the network, the server's queue); else the
    request's own phases (connect, headers). '' for a local answer."""
    if m.headers_ms is None or m.ttft_ms is None or m.ttft_ms <= 0:
        return ""
    ttft = m.ttft_ms
    if m.server_ttft_ms is not None and m.transport_ms is not None:  # vLLM's /metrics
        queue = f"queue {m.server_queue_ms:,.0f} ms, " if m.server_queue_ms is not None else ""
        prefill = m.server_prompt_ms
        return (
            f"TTFT {ttft:,.0f} ms: the server's own {m.server_ttft_ms:,.0f} ms ({queue}"
            + (f"prefill {prefill:,.0f} ms" if prefill is not None else "prefill unknown")
            + f"), the transport {m.transport_ms:,.0f} ms ({m.transport_ms / ttft:.0%})"
        )
    if m.server_prompt_ms is not None and m.server_prompt_ms <= ttft:
        rest = ttft - m.server_prompt_ms
        return (
            f"TTFT {ttft:,.0f} ms: the server's prefill {m.server_prompt_ms:,.0f} ms, "
            f"the transport and its queue {rest:,.0f} ms ({rest / ttft:.0%})"
        )
    connect = f"connect {m.connect_ms:,.0f} ms, " if m.connect_ms else ""
    return (
        f"TTFT {ttft:,.0f} ms: {connect}headers at {m.headers_ms:,.0f} ms "
        "(the server does not say its own prefill time)"
    )


def stats_line(m: Metrics) -> str:
    """The answer's figures in one line, as `ollama run --verbose` prints them after an
    answer: TTFT (and the wait for the model to load in it), prompt tokens (cached /
    evaluated), prefill and decode rates, e2e."""

    def n(v: float | None, unit: str, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}{unit}"

    approx = "~" if m.output_tokens_estimated else ""
    cached = "cache unknown" if m.cached_tokens is None else f"{m.cached_tokens:,} cached"
    evaluated = (
        "" if m.evaluated_prompt_tokens is None else f", {m.evaluated_prompt_tokens:,} evaluated"
    )
    load = f" (load {m.load_ms:,.0f} ms)" if m.load_ms is not None else ""
    return (
        f"ttft {n(m.ttft_ms, ' ms')}{load}"
        f" · prompt {n(m.prompt_tokens, '')} tokens ({cached}{evaluated})"
        f" · prefill {n(m.prefill_tok_s, ' tok/s', 1)} · decode {n(m.decode_tok_s, ' tok/s', 1)}"
        f" ({approx}{m.output_tokens:,} tokens) · e2e {n(m.e2e_ms, ' ms')}"
    )


def engine_says(m: Metrics) -> str:
    """The engine's own account beside ours, labelled with its source ('' when it gave
    none): `vLLM /metrics says prefill 532.0 tok/s (199 tokens, 192 cached) · decode 23.0
    tok/s · queue 0 ms · pool 46,592 tokens, 3% full, blocks of 32`."""
    return "".join(engine_account(m))


def engine_account(m: Metrics) -> tuple[str, str]:
    """`engine_says` in two parts: the label ("vLLM /metrics says ", '' when the line
    has none) and the figures."""

    def n(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    who = {"llama.cpp": "llama.cpp", "timings": "the server"}.get(
        m.server_source or "", m.server_source or "the server"
    )
    label, bits = "", []
    if m.server_prompt_ms is not None or m.server_predicted_ms is not None:
        cached = f", {m.server_cache_n:,} cached" if m.server_cache_n else ""
        label = f"{who} says "
        bits.append(
            f"prefill {n(m.server_prefill_tok_s)} tok/s "
            f"({m.server_prompt_n} tok{cached}) · decode {n(m.server_decode_tok_s)} tok/s"
        )
        if m.server_queue_ms is not None:
            bits.append(f"queue {m.server_queue_ms:,.0f} ms")
    elif m.server_unknown:
        bits.append(f"{who}: this request's own figures unknown ({m.server_unknown})")
    if m.server_kv_pool_tokens:
        share = m.server_kv_used_share
        full = f", {share:.0%} full at the send" if share is not None else ""
        block = f", blocks of {m.server_kv_block_tokens}" if m.server_kv_block_tokens else ""
        bits.append(f"KV pool {m.server_kv_pool_tokens:,} tokens{full}{block}")
    return label, " · ".join(bits)
