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

With layers on a GPU the bytes a token reads are split between the GPU's memory and
the host's (backends/local/offload.py), and memory needs gpu bytes / the GPU's bandwidth + cpu
bytes / the host's a token: the roofline says both shares, and never divides the GPU's
reads by the host's bandwidth. The knob follows the regime: far below that floor (a
token in about a millisecond on a GPU), the time goes to per-token overhead (kernel
launches, Python, sampling), which smaller weights do not cut; with the host's share of
the reads the slower one, the lever is more layers on the GPU.

On the CPU, decode far below what memory allows is held by something else than the
weights, and the knob names what was measured (`cpu_knob`): a busy machine (other
processes' work on the CPUs, beside the engine's threads, more than the cores), or the
time a token spends outside llama.cpp's own decode (sampling, detokenizing, the
hand-over); the weights only when neither is so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from phasechat.backends.remote.servers import said_by
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.waterfall import CONNECT, QUEUED, REST, SENT, waterfall_of

KNOBS = {
    "prefill": "a shorter prompt, a stable prefix the engine can cache, or trimming the history",
    "decode": "smaller or more quantized weights, or a lower max_tokens",
    "thinking": "less thinking (a lower reasoning effort or a non-thinking mode), "
    "or a lower max_tokens",
    # not a knob to try: the wait is over once the model is loaded (Verdict.line)
    "load": "the model was still loading when this was sent: it loads once, the next "
    "answers do not wait for it (a smaller model file loads sooner)",
}

#: Decode below this share of what memory allows is overhead-bound, not memory-bound
OVERHEAD_SHARE = 0.5

#: Other processes' work on the CPUs (CPUs' worth, while the engine decoded) from which
#: a busy machine is named, when with the engine's threads it is more than the CPUs
#: (the UI and the odd daemon make a few hundredths on a quiet machine)
BUSY_CPUS = 0.25

#: The share of a token's time outside llama.cpp's own decode from which per-token
#: overhead is named
OVERHEAD_GAP = 0.25

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
    #: a remote answer: the part of its wait that dominated it (the server's queue, or
    #: the transport), and the workers a server split it between ('' for neither)
    wait: str = ""

    def line(self) -> str:
        """One line: `decode-bound (decode 78% · prefill 22%): try ... · decode runs at ...`"""
        shares = " · ".join(f"{name} {share:.0%}" for name, share in self.shares)
        tail = f" · {self.transport}" if self.transport else ""
        tail += f" · {self.wait}" if self.wait else ""
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


@dataclass(frozen=True, slots=True)
class Memory:
    """What the roofline divides by: the host's memory bandwidth and, with layers on a
    GPU, the GPU's (GB/s; None: unknown), each with its label (how far to trust it,
    where it comes from)."""

    cpu_gb_s: float | None = None
    cpu_label: str = ""
    gpu_gb_s: float | None = None
    gpu_label: str = ""


@dataclass(frozen=True, slots=True)
class Floor:
    """A decode step on a GPU, at memory speed and as it ran (ms)."""

    gpu_ms: float  # the GPU's share of the reads at its bandwidth
    cpu_ms: float  # the host's share at the host's bandwidth (0: every layer on the GPU)
    actual_ms: float  # 1 / decode rate

    @property
    def memory_ms(self) -> float:
        return self.gpu_ms + self.cpu_ms

    @property
    def share(self) -> float:
        """The share of what memory allows that decode reached."""
        return self.memory_ms / self.actual_ms


def _known(gb_s: float | None) -> bool:
    return gb_s is not None and 0 < gb_s < math.inf  # NaN fails too


def gpu_floor(m: Metrics, memory: Memory) -> Floor | None:
    """With layers on a GPU: the step's time at memory speed beside its real time;
    None without a decode rate, the split, or a bandwidth a part needs."""
    gpu_bytes, cpu_bytes, rate = m.gpu_bytes_per_token, m.cpu_bytes_per_token or 0, m.decode_tok_s
    if gpu_bytes is None or rate is None or not rate > 0 or not _known(memory.gpu_gb_s):
        return None
    if cpu_bytes and not _known(memory.cpu_gb_s):
        return None
    gpu_ms = gpu_bytes / (memory.gpu_gb_s or 1) / 1e6
    cpu_ms = cpu_bytes / (memory.cpu_gb_s or 1) / 1e6 if cpu_bytes else 0.0
    return Floor(gpu_ms, cpu_ms, 1000 / rate)


def gpu_roofline(m: Metrics, memory: Memory) -> str:
    """The roofline with layers on a GPU: the GPU's share of a token's reads at its
    bandwidth, the host's at its own, and what the two allow beside what decode did."""
    if m.decode_tok_s is None:
        return _no_rate(m)
    if not _known(memory.gpu_gb_s):
        return "roofline unknown: the GPU's memory bandwidth is not known (no CUDA runtime)"
    floor = gpu_floor(m, memory)
    if floor is None:
        return "roofline unknown: this machine's memory bandwidth is not measured"
    gpu_bytes, cpu_bytes = m.gpu_bytes_per_token or 0, m.cpu_bytes_per_token or 0
    gpu = f"{memory.gpu_gb_s:,.0f} GB/s" + (f", {memory.gpu_label}" if memory.gpu_label else "")
    took = f"{floor.actual_ms:.2f} ms a token where memory needs {floor.memory_ms:.2f}"
    if not cpu_bytes:
        reads = gpu_bytes * m.decode_tok_s / 1e9
        return (
            f"decode runs at {floor.share:.0%} of what the GPU's memory allows "
            f"({reads:.1f} of {gpu}; {took})"
        )
    host = f"{memory.cpu_gb_s:.1f} GB/s" + (f", {memory.cpu_label}" if memory.cpu_label else "")
    return (
        f"decode runs at {floor.share:.0%} of what memory allows: a token reads "
        f"{gpu_bytes / 1e9:.2f} GB on the GPU ({floor.gpu_ms:.2f} ms at {gpu}) and "
        f"{cpu_bytes / 1e9:.2f} GB in host memory ({floor.cpu_ms:.2f} ms at {host}); {took}"
    )


def gpu_knob(m: Metrics, memory: Memory) -> str | None:
    """Decode's knob with layers on a GPU, by regime: more layers on the GPU while the
    host's share of the reads is the slower part; per-token overhead while decode runs
    far below what memory allows; None (the general knob: smaller weights) otherwise."""
    floor = gpu_floor(m, memory)
    if floor is None:
        return None
    if floor.cpu_ms > 0 and floor.cpu_ms >= floor.gpu_ms:
        return (
            "more layers on the GPU (a higher --gpu-layers, -1 for all): the part of each "
            f"token read in host memory takes {floor.cpu_ms:.2f} of the {floor.memory_ms:.2f} "
            "ms memory needs"
        )
    if floor.share < OVERHEAD_SHARE:
        return (
            "less per-token overhead (kernel launches, Python, sampling), not smaller "
            f"weights: a token takes {floor.actual_ms:.2f} ms where memory needs "
            f"{floor.memory_ms:.2f}"
        )
    return None


def cpu_knob(m: Metrics, bandwidth_gb_s: float | None) -> str | None:
    """Decode's knob on the CPU when it runs far below what memory allows (under
    OVERHEAD_SHARE of the roofline): a busy machine when other processes' work and the
    engine's threads are more than the CPUs; else per-token overhead when a token took
    OVERHEAD_GAP or more beyond llama.cpp's own decode time for it; None (the general
    knob: smaller weights) otherwise, or without the roofline."""
    implied = m.implied_bandwidth_gb_s
    if implied is None or not _known(bandwidth_gb_s):
        return None
    if implied / (bandwidth_gb_s or 1) >= OVERHEAD_SHARE:
        return None
    busy, cpus, threads = m.busy_cpus, m.cpus, m.threads
    if busy is not None and cpus and threads and busy >= BUSY_CPUS and busy + threads > cpus:
        return (
            f"fewer other processes on this machine's {cpus} CPUs, not smaller weights: "
            f"others kept {busy:.1f} of them busy while it decoded, beside the engine's "
            f"{threads} thread{'s' if threads != 1 else ''}"
        )
    ours, own = m.decode_tok_s, m.server_decode_tok_s
    if m.server_source == "llama.cpp" and ours and own and 0 < ours < own:
        token_ms, decode_ms = 1000 / ours, 1000 / own
        if (token_ms - decode_ms) / token_ms >= OVERHEAD_GAP:
            return (
                "less per-token overhead (sampling, detokenizing, the hand-over), not "
                f"smaller weights: llama.cpp's own decode took {decode_ms:.2f} of the "
                f"{token_ms:.2f} ms a token took"
            )
    return None


def _no_rate(m: Metrics) -> str:
    why = "the tokens came in a burst" if m.decode_unknown else "fewer than two tokens"
    return f"roofline: no decode rate ({why})"


def roofline(
    m: Metrics, bandwidth_gb_s: float | None, label: str = "", memory: Memory | None = None
) -> str:
    """`decode runs at N% of what memory allows (X of Y GB/s)`, or why it is unknown.
    `label`: how far to trust the bandwidth (e.g. "probed on a busy machine"). With
    layers on a GPU (`m.gpu_bytes_per_token`), `gpu_roofline` with `memory`'s GPU."""
    if m.gpu_bytes_per_token is not None:
        return gpu_roofline(
            m, replace(memory or Memory(), cpu_gb_s=bandwidth_gb_s, cpu_label=label)
        )
    if m.implied_bandwidth_gb_s is None:
        if m.decode_tok_s is None:
            return _no_rate(m)
        return "roofline unknown: the weights' size is not known for this backend"
    if not _known(bandwidth_gb_s):
        return "roofline unknown: this machine's memory bandwidth is not measured"
    share = m.implied_bandwidth_gb_s / (bandwidth_gb_s or 1)
    of = f"{m.implied_bandwidth_gb_s:.1f} of {bandwidth_gb_s:.1f} GB/s"
    return f"decode runs at {share:.0%} of what memory allows ({of}{label and ', ' + label})"


def knob(phase: str, m: Metrics, memory: Memory | None = None) -> str:
    """The knob for `phase`, made specific where the figures say which part applies;
    decode's follows the regime, given `memory`: `gpu_knob` with layers on a GPU,
    `cpu_knob` without."""
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
    regime = None
    if phase == "decode" and memory is not None:
        on_gpu = m.gpu_bytes_per_token is not None
        regime = gpu_knob(m, memory) if on_gpu else cpu_knob(m, memory.cpu_gb_s)
    if phase in ("decode", "thinking") and m.finish == "length":
        first = regime or KNOBS[phase].split(", or")[0]
        return "a lower max_tokens (the answer stopped at it), " + first
    return regime or KNOBS[phase]


def verdict(
    m: Metrics,
    bandwidth_gb_s: float | None = None,
    bandwidth_label: str = "",
    gpu_gb_s: float | None = None,
    gpu_label: str = "",
) -> Verdict | None:
    """The verdict on one finished answer; None when it has no timing to judge (a request
    that failed before its first token). `bandwidth_label`: see `roofline`; `gpu_gb_s`:
    the GPU's memory bandwidth, for an answer with layers on it, `gpu_label` where the
    figure comes from."""
    shares = phase_shares(m)
    if shares is None:
        return None
    phase = shares[0][0]
    memory = Memory(bandwidth_gb_s, bandwidth_label, gpu_gb_s, gpu_label)
    return Verdict(
        phase,
        shares,
        knob(phase, m, memory),
        roofline(m, bandwidth_gb_s, bandwidth_label, memory),
        transport(m),
        wait(m),
    )


def wait(m: Metrics) -> str:
    """What dominated a remote answer's wait for its first token, by its waterfall: the
    server's queue, or (where the server says its queue, so that the rest is not it)
    the transport; and
    the prefill and decode workers where the server split the answer between two.
    '' when nothing dominated and no workers were named."""
    found = waterfall_of(m)
    if found is None:
        return ""
    bits = []
    top = found.dominant()
    ttft = found.ttft_ms
    # without the server's queue, what is left may be that queue: `transport` says so
    queue_said = found.ms(QUEUED) is not None
    if top is not None and top.means is not None:  # the server's own part, as it defines it
        bits.append(f"{top.shown}: {top.ms or 0:,.0f} of the {ttft:,.0f} ms TTFT ({top.means})")
    elif top is not None and top.name == QUEUED:
        bits.append(
            f"the queue: {top.ms or 0:,.0f} of the {ttft:,.0f} ms TTFT waited in the "
            "server's queue behind other requests (fewer requests at once, or more replicas)"
        )
    elif top is not None and top.name in (CONNECT, SENT, REST) and queue_said:
        rest = sum(found.ms(n) or 0.0 for n in (CONNECT, SENT, REST))
        bits.append(
            f"the transport: {rest:,.0f} of the {ttft:,.0f} ms TTFT is outside the "
            "server's own account (connecting, sending, the way back): a nearer server "
            "or a kept-alive connection"
        )
    p, d = m.server_prefill_worker, m.server_decode_worker
    if p is not None and d is not None and p != d:
        bits.append(f"prefill on worker {p}, decode on worker {d} (disaggregated)")
    elif p is not None or d is not None:
        bits.append(f"prefill and decode on worker {p or d}")
    return " · ".join(bits)


def transport(m: Metrics) -> str:
    """A remote answer's TTFT, split: the server's own time to first token, queue and
    prefill and the transport's share (vLLM's /metrics), or the server's own prefill
    (llama-server's `prompt_ms`) and the rest (the network, the server's queue); else the
    request's own phases (connect, headers). '' for a local answer."""
    if m.headers_ms is None or m.ttft_ms is None or m.ttft_ms <= 0:
        return ""
    ttft = m.ttft_ms
    if m.server_ttft_ms is not None and m.transport_ms is not None:  # vLLM's /metrics
        # its parts under the server's own names where it defines them otherwise (Dynamo)
        named_queue, named_prefill = m.server_queue_name or "queue", m.server_prefill_name
        queue = (
            f"{named_queue} {m.server_queue_ms:,.0f} ms, " if m.server_queue_ms is not None else ""
        )
        prefill = m.server_prompt_ms
        return (
            f"TTFT {ttft:,.0f} ms: the server's own {m.server_ttft_ms:,.0f} ms ({queue}"
            + f"{named_prefill or 'prefill'} "
            + (f"{prefill:,.0f} ms" if prefill is not None else "unknown")
            + f"), the transport {m.transport_ms:,.0f} ms ({m.transport_ms / ttft:.0%})"
        )
    if m.server_prompt_ms is not None and m.server_prompt_ms <= ttft:
        rest = ttft - m.server_prompt_ms
        if m.server_prefill_name is not None:  # no prefill alone: the rest is not a queue
            return (
                f"TTFT {ttft:,.0f} ms: the server's {m.server_prefill_name} "
                f"{m.server_prompt_ms:,.0f} ms, the rest {rest:,.0f} ms ({rest / ttft:.0%})"
            )
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
    decode = f"unknown ({m.decode_unknown})" if m.decode_unknown else n(m.decode_tok_s, " tok/s", 1)
    return (
        f"ttft {n(m.ttft_ms, ' ms')}{load}"
        f" · prompt {n(m.prompt_tokens, '')} tokens ({cached}{evaluated})"
        f" · prefill {n(m.prefill_tok_s, ' tok/s', 1)} · decode {decode}"
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

    who = said_by(m.server_source)
    label, bits = "", []
    if m.server_prompt_ms is not None or m.server_predicted_ms is not None:
        cached = f", {m.server_cache_n:,} cached" if m.server_cache_n else ""
        label = f"{who} says "
        if m.server_prefill_name is not None and m.server_prompt_ms is not None:
            # the server's own parts, as it defines them: its "prefill" is no prefill
            # alone (Dynamo's holds the worker's queue), so no rate is made of it
            if m.server_queue_ms is not None:
                bits.append(f"{m.server_queue_name or 'queue'} {m.server_queue_ms:,.0f} ms")
            bits.append(f"{m.server_prefill_name} {m.server_prompt_ms:,.0f} ms")
        else:
            bits.append(
                f"prefill {n(m.server_prefill_tok_s)} tok/s "
                f"({'-' if m.server_prompt_n is None else m.server_prompt_n} tok{cached})"
                f" · decode {n(m.server_decode_tok_s)} tok/s"
            )
            if m.server_queue_ms is not None:
                bits.append(f"queue {m.server_queue_ms:,.0f} ms")
    elif m.server_unknown:
        bits.append(f"{who}: this request's own figures unknown ({m.server_unknown})")
    if m.server_kv_hit_share is not None:  # Dynamo's router: the prompt found cached
        bits.append(f"KV hit {m.server_kv_hit_share:.0%}")
    if m.server_kv_pool_tokens:
        share = m.server_kv_used_share
        full = f", {share:.0%} full at the send" if share is not None else ""
        block = f", blocks of {m.server_kv_block_tokens}" if m.server_kv_block_tokens else ""
        bits.append(f"KV pool {m.server_kv_pool_tokens:,} tokens{full}{block}")
    return label, " · ".join(bits)
