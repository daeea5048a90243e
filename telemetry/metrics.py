"""Metrics of one request, named as serving benchmarks name them (vLLM, AIPerf).

- `ttft_ms`: request sent -> first token of any kind (thinking or answer): the user's
  wait, a wait for the model to load included.
- `load_ms`: the part of TTFT the request waited for the model to load (a local model
  still loading when it was sent; None: it did not wait). Not prefill: the prefill rate,
  the forecasts and the verdict count the time after it (`ttft_ready_ms`).
- `ttfo_ms`: request sent -> first answer token (AIPerf's "time to first output token");
  equal to TTFT for a model that does not think.
- `e2e_ms`: request sent -> last event.
- `prefill_tok_s`: prompt tokens actually evaluated (cached ones excluded) / TTFT (less
  `load_ms`). None
  when the server does not say how much of the prompt it had cached (`cache_reported`
  False: vLLM without prompt-token details, Ollama): a rate from a guess would be wrong
  by the whole cached prefix.
- `output_tokens`: every generated token, thinking included (as `usage.completion_tokens`);
  `reasoning_tokens` (the thinking's share: the server's count, else the model's
  tokenizer, else an estimate; `reasoning_tokens_source` says which) and `answer_tokens`.
- `reasoning_ms`: first thinking token -> first answer token (or last thinking token).
- `decode_tok_s`: (output_tokens - 1) / (last token - first token): the whole decode
  window, thinking included, first token excluded. Never output tokens / total wall time.
  The window ends where the count ends: when the server's count includes a token it sent
  no text for (the end-of-sequence token: vLLM, llama-server), at the chunk that stood
  for it (`Finished.t_silent_ns`), one decode step after the last text.
  Unknown (None, and `decode_unknown` says why) when the tokens came in a burst: closer
  together than any engine decodes them (`figures.decode_rate`: a proxy that buffers the stream
  hands on what was decoded earlier); the server's own account (`server_decode_tok_s`)
  is still shown as the server's.
- `tpot_ms`: the same window per token; `itl_ms_*`: gaps between consecutive token events
  (tokens locally; chunks remotely, where a chunk is not necessarily a token).
- `chars` (of the answer), `chars_per_s`, `chars_per_token`: Unicode characters over the
  answer's own decode window (first answer event -> last token; the first event's
  characters excluded), so `chars_per_s == chars_per_token x` the answer's token rate,
  which is `decode_tok_s` for a model that does not think.
- `draft_acceptance`: speculative decoding, accepted / drafted tokens (llama-server).
- `threads`, `thread_changes`, `threads_reason`: the local engine's decode thread count
  at the end of the answer, how many times it changed during it (it drops when a busy
  neighbour makes the gaps between tokens grow, and probes back up), and the last reason.
- `busy_cpus`, `cpus`: the CPUs' worth of work other processes did on this machine's
  CPUs while the local engine decoded (its own CPU time left out), of the CPUs it may run
  on: what the verdict weighs the engine's threads against.

`server_*` fields are the engine's own account beside ours: llama-server's `timings`,
or, for the local backend, llama.cpp's perf counters (per-request deltas).

Every count says where it came from: `*_source` is "tokenizer" (the local model's own),
"server" (usage / timings) or "estimate" (tiktoken), and `*_estimated` is True for the last.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from phasechat.backends.remote.server_metrics import beyond
from phasechat.backends.remote.servers import timings_source
from phasechat.backends.tokens import estimate_text
from phasechat.telemetry import figures
from phasechat.telemetry.figures import rate
from phasechat.telemetry.metric_set import (
    CpuFigures,
    DraftFigures,
    KvFigures,
    ServerFigures,
    TimingFigures,
    TokenFigures,
)
from phasechat.telemetry.metric_set import Metrics as Metrics
from phasechat.telemetry.metric_set import metrics_from_dict as metrics_from_dict
from phasechat.telemetry.recorder import Trace

_NS_PER_MS = 1_000_000


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation (numpy's default)."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def itl_ms(trace: Trace) -> list[float]:
    """Gaps between consecutive recorded text events, in ms (from the stored times)."""
    t = trace.times
    scale = _NS_PER_MS * trace.stride
    return [(t[i] - t[i - 1]) / scale for i in range(1, len(t))]


def compute(trace: Trace, now_ns: int | None = None) -> Metrics:
    """Metrics of `trace`; for a request still running, pass `now_ns` for live values."""
    ms = functools.partial(figures.since_sent_ms, trace)
    ttft = figures.ttft_ms(trace)
    e2e = figures.elapsed_ms(trace, now_ns)
    load = figures.load_ms(trace, now_ns)
    ready_ttft = figures.ready_ms(ttft, load)

    prompt_tokens, prompt_source, cached, evaluated = _prompt_counts(trace)
    output, out_estimated, counted_by_server = _output_tokens(trace)
    thought, thought_source = _reasoning_tokens(trace, output, out_estimated)
    answer = max(0, output - thought) if thought is not None else output

    d = figures.decode(trace, output, counted_by_server)
    burst = d.unknown

    gaps = sorted(itl_ms(trace))
    pick = (lambda q: percentile(gaps, q)) if gaps else (lambda q: None)

    answer_s = figures.window_s(trace.t_first_answer, d.last)
    window_chars = trace.chars - trace.chars_first
    chars_per_token = window_chars / (answer - 1) if answer_s and answer > 1 else None
    share = ready_ttft / e2e if ready_ttft is not None and e2e else None

    s, a = trace.server, trace.account
    known = a if a is not None and a.unknown is None else None  # this request's own
    # what the server's queue and prefill figures cover, where it defines them otherwise
    queue_means = known.queue_means if known else None
    prefill_means = known.prefill_means if known else None
    own, contradictions = _bounded_engine(trace, _engine(trace), ttft, e2e)
    block = a.block_tokens if a else None
    kv_used = prompt_tokens + output if prompt_tokens is not None and trace.window else None
    if kv_used is not None and block:  # a server holds KV in whole blocks
        kv_used = -(-kv_used // block) * block
    timing = TimingFigures(
        ttft_ms=ttft,
        ttfo_ms=figures.ttfo_ms(trace),
        e2e_ms=e2e,
        first_byte_ms=ms(trace.t_first_byte),
        reasoning_ms=figures.reasoning_ms(trace, now_ns),
        prefill_tok_s=figures.prefill_rate(evaluated, ttft, load),
        decode_tok_s=d.tok_s,
        tpot_ms=d.tpot_ms,
        itl_ms_p50=pick(50),
        itl_ms_p95=pick(95),
        itl_ms_p99=pick(99),
        itl_ms_max=gaps[-1] if gaps else None,
        chars_per_s=figures.chars_per_s(trace, d),
        prefill_share=share,
        decode_share=1 - ttft / e2e if ttft is not None and e2e else None,
        connect_ms=trace.connect_ms,
        headers_ms=ms(trace.t_first_byte),
        time_to_second_token_ms=ms(trace.t_second_token),
        load_ms=load,
        sent_ms=ms(trace.t_body_sent),
        decode_unknown=burst,
    )
    tokens = TokenFigures(
        prompt_tokens=prompt_tokens,
        prompt_tokens_source=prompt_source,
        cached_tokens=cached,
        evaluated_prompt_tokens=evaluated,
        output_tokens=output,
        output_tokens_estimated=out_estimated,
        reasoning_tokens=thought,
        reasoning_tokens_source=thought_source,
        answer_tokens=answer,
        cache_reported=cached is not None,
        chars=trace.chars,
        chars_per_token=chars_per_token,
    )
    server = ServerFigures(
        server_prompt_n=own.prompt_n,
        server_cache_n=own.cache_n,
        server_prompt_ms=own.prompt_ms,
        server_predicted_n=own.predicted_n,
        server_predicted_ms=own.predicted_ms,
        server_prefill_tok_s=own.prefill_tok_s,
        server_decode_tok_s=own.decode_tok_s,
        server_source=own.source,
        server_ttft_ms=known.ttft_ms if known else None,
        server_queue_ms=known.queue_ms if known else None,
        transport_ms=ttft - known.ttft_ms
        if known and known.ttft_ms is not None and ttft is not None and ttft >= known.ttft_ms
        else None,
        server_unknown=a.unknown if a else None,
        server_kv_hit_share=known.kv_hit_share if known else None,
        server_prefill_worker=known.prefill_worker if known else None,
        server_decode_worker=known.decode_worker if known else None,
        server_queue_name=queue_means.name if queue_means else None,
        server_queue_means=queue_means.means if queue_means else None,
        server_prefill_name=prefill_means.name if prefill_means else None,
        server_prefill_means=prefill_means.means if prefill_means else None,
        server_load_ms=known.load_ms if known else None,
    )
    kv = KvFigures(
        # the engine's KV figures; for a server, what this chat holds of its window
        kv_used_tokens=trace.kv.used_tokens if trace.kv else kv_used,
        kv_capacity_tokens=trace.kv.capacity_tokens if trace.kv else trace.window,
        kv_bytes=trace.kv.used_bytes if trace.kv else None,
        implied_bandwidth_gb_s=_bandwidth(trace, d.tok_s),
        context_window=trace.window,
        context_source=trace.window_source,
        server_kv_pool_tokens=a.pool_tokens if a else None,
        server_kv_used_share=a.used_share if a else None,
        server_kv_block_tokens=block,
        gpu_bytes_per_token=trace.kv.gpu_bytes if trace.kv else None,
        cpu_bytes_per_token=trace.kv.cpu_bytes if trace.kv else None,
    )
    cpu = CpuFigures(
        threads=trace.threads.threads if trace.threads else None,
        thread_changes=trace.thread_changes if trace.threads else None,
        threads_reason=trace.threads.reason if trace.threads else None,
        busy_cpus=trace.cpu_busy.others if trace.cpu_busy else None,
        cpus=trace.cpu_busy.cpus if trace.cpu_busy else None,
    )
    draft = DraftFigures(
        server_draft_n=s.draft_n if s else None,
        server_draft_accepted=s.draft_n_accepted if s else None,
        draft_acceptance=s.draft_n_accepted / s.draft_n
        if s and s.draft_n and s.draft_n_accepted is not None
        else None,
    )
    warnings = _disagreements(trace, prompt_tokens) + contradictions + ([burst] if burst else [])
    return Metrics(
        trace.backend, trace.model, trace.finish, timing, tokens, server, kv, cpu, draft,
        tuple(warnings),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Engine:
    """The engine's own account of the request, in one shape whatever its source."""

    source: str | None = None
    prompt_n: int | None = None  # evaluated
    cache_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None


def _engine(trace: Trace) -> _Engine:
    """llama.cpp's counters (local) or llama-server's `timings`, else the server's
    /metrics account when it is this request's alone. Its decode time runs from the
    first token to the last (vLLM's `request_decode_time`), so its rate is over the
    tokens after the first, as ours is; llama.cpp's `timings` count every token."""
    s, a = trace.server, trace.account
    if s is not None:
        return _Engine(
            timings_source(local=trace.prompt is not None),
            s.prompt_n,
            s.cache_n,
            s.prompt_ms,
            s.predicted_n,
            s.predicted_ms,
            rate(s.prompt_n, s.prompt_ms / 1000 if s.prompt_ms else None),
            rate(s.predicted_n, s.predicted_ms / 1000 if s.predicted_ms else None),
        )
    if a is None or a.unknown is not None:
        return _Engine()
    p, c, n = a.prompt_tokens, a.cached_tokens, a.generated_tokens
    evaluated = p - c if p is not None and c is not None else None
    return _Engine(
        a.source,
        evaluated,
        c,
        a.prefill_ms,
        n,
        a.decode_ms,
        rate(evaluated, a.prefill_ms / 1000 if a.prefill_ms else None),
        rate(n - 1 if n else None, a.decode_ms / 1000 if a.decode_ms else None),
    )


def _bounded_engine(
    trace: Trace, own: _Engine, ttft: float | None, e2e: float | None
) -> tuple[_Engine, list[str]]:
    """A server's own times held against ours (the local engine is its own clock: not
    checked). Its prefill and decode happen inside our e2e: longer, they are unknown,
    said in one line. Its prefill (with its queue, where it says) ends before the first
    token reaches us: longer than our TTFT is a contradiction, named (which clock is
    wrong, neither can say)."""
    if trace.prompt is not None or trace.t_done is None:
        return own, []
    out: list[str] = []
    said = [t for t in (own.prompt_ms, own.predicted_ms) if t is not None]
    if e2e is not None and said and beyond(sum(said), e2e):
        out.append(
            f"the server's prefill + decode ({sum(said):,.1f} ms) exceed this request's "
            f"{e2e:,.1f} ms measured here: not believed"
        )
        own = replace(own, prompt_ms=None, predicted_ms=None, prefill_tok_s=None, decode_tok_s=None)
    a = trace.account if trace.account is not None and not trace.account.unknown else None
    first = a.ttft_ms if a is not None and a.ttft_ms is not None else None
    if first is None and own.prompt_ms is not None:
        queue = a.queue_ms if a is not None and a.queue_ms is not None else 0.0
        first = queue + own.prompt_ms
    if first is not None and ttft is not None and beyond(first, ttft):
        out.append(
            f"contradiction: the server took {first:,.1f} ms to its first token, longer "
            f"than the {ttft:,.1f} ms TTFT measured here"
        )
    return own, out


def _bandwidth(trace: Trace, decode_tok_s: float | None) -> float | None:
    """Roofline hint: each decode step reads all weights and the KV cache so far, so
    tok/s x (weight bytes + KV bytes) is the memory bandwidth the engine achieved."""
    kv = trace.kv
    if kv is None or not kv.model_bytes or not decode_tok_s:
        return None
    return decode_tok_s * (kv.model_bytes + kv.used_bytes) / 1e9


def _prompt_counts(trace: Trace) -> tuple[int | None, str, int | None, int | None]:
    """(prompt tokens, source, cached, evaluated), best source first."""
    if trace.prompt is not None:  # local: the model's tokenizer and the KV prefix match
        p = trace.prompt
        return p.prompt_tokens, "tokenizer", p.cached_tokens, p.evaluated_tokens
    s, u = trace.server, trace.usage
    if s is not None and s.prompt_n is not None:
        # llama-server: prompt_n is what it evaluated, cache_n what it reused
        cache = s.cache_n or 0
        said = u.prompt_tokens if u is not None else None
        return said if said is not None else s.prompt_n + cache, "server", cache, s.prompt_n
    if (
        u is not None and u.prompt_tokens is not None
    ):  # what it cached, only where it says (else: unknown, not zero)
        cached = u.cached_tokens
        a = trace.account  # vLLM without prompt-token details: its /metrics says
        if (  # its own per-request figure (SGLang's sglext) is bounded by this prompt
            cached is None
            and a is not None
            and not a.unknown
            and a.prompt_tokens in (None, u.prompt_tokens)
        ):
            cached = a.cached_tokens
        evaluated = u.prompt_tokens - cached if cached is not None else None
        return u.prompt_tokens, "server", cached, evaluated
    if trace.prompt_estimate is not None:  # a server that reports nothing: ours, cache unknown
        src = "tokenizer" if trace.prompt_estimate_exact else "estimate"
        return trace.prompt_estimate, src, None, None
    return None, "none", None, None


def _output_tokens(trace: Trace) -> tuple[int, bool, bool]:
    """Every generated token (thinking included), best source first (the live panel's
    count, `figures.counted_tokens`), else estimated: (count, estimated, counted by the
    server)."""
    counted = figures.counted_tokens(trace)
    if counted is not None:
        return counted[0], False, counted[1]
    return estimate_text(trace.reasoning) + estimate_text(trace.text), True, False


def _reasoning_tokens(trace: Trace, output: int, output_estimated: bool) -> tuple[int | None, str]:
    """The thinking's tokens and where the count came from: the server's own count, the
    backend's per-token count (the local model's tokenizer), else an estimate: tiktoken's
    share of the thinking in the whole output, applied to the output's count (so that a
    server's exact total is kept, e.g. llama-server, which does not split it)."""
    u = trace.usage
    if u is not None and u.reasoning_tokens is not None:
        return u.reasoning_tokens, "server"
    if not trace.reasoning_deltas:
        return None, "none"
    if trace.reasoning_tokens_known:
        return trace.reasoning_tokens, "tokenizer"
    thought = estimate_text(trace.reasoning)
    if output_estimated:
        return thought, "estimate"
    said = estimate_text(trace.text)
    return round(output * thought / (thought + said)) if thought else 0, "estimate"


#: With no window to compare against, a server that read less than this share of our
#: estimate (another tokenizer's count) is taken to have cut the prompt.
TRUNCATED_SHARE = 0.5


def _disagreements(trace: Trace, prompt_tokens: int | None) -> list[str]:
    """Server truth vs client truth, where the difference matters.

    The local backend is its own engine: its counts are exact, a prompt that does not fit
    is refused, and every token it made arrives, so nothing is checked there (llama.cpp's
    own counters misfile a token or two between prompt and decode)."""
    out: list[str] = []
    s, u = trace.server, trace.usage
    if trace.prompt is None:
        if s is not None and s.prompt_n is not None and u is not None and u.prompt_tokens:
            seen = s.prompt_n + (s.cache_n or 0)
            if seen < u.prompt_tokens:
                out.append(
                    f"server evaluated + cached {seen} of {u.prompt_tokens} prompt tokens: "
                    "the prompt was truncated"
                )
        out += _cut_to_window(trace)
    if (
        trace.prompt is None  # the local backend counts what it made itself
        and s is not None
        and trace.tokens_known
        and trace.deltas
        and s.predicted_n
        # the engine does not decode the last token, and counts a 1-token prompt batch
        # as decode: one either way is agreement
        and abs(s.predicted_n - trace.tokens) > 1
    ):
        out.append(f"server generated {s.predicted_n} tokens, {trace.tokens} arrived")
    if trace.max_tokens and trace.tokens_known and trace.tokens > trace.max_tokens:
        out.append(f"{trace.tokens} tokens exceed max_tokens {trace.max_tokens}")
    if prompt_tokens is None:
        out.append("no prompt token count from the server")
    # first: a figure the server sent and we did not believe explains the others
    return trace.doubts + out


def _cut_to_window(trace: Trace) -> list[str]:
    """A server that read fewer prompt tokens than we sent (Ollama cuts to num_ctx
    silently), judged against its real window where we know it."""
    s, u, sent = trace.server, trace.usage, trace.prompt_estimate
    read = u.prompt_tokens if u is not None else None
    if read is None and s is not None and s.prompt_n is not None:
        read = s.prompt_n + (s.cache_n or 0)
    if not sent or read is None or read >= sent:
        return []
    approx = "" if trace.prompt_estimate_exact else "~"
    window = trace.window
    if window is not None and sent > window:
        return [
            f"the server's window is {window:,} tokens; we sent {approx}{sent:,} prompt "
            f"tokens and it read {read:,}: the prompt was truncated"
        ]
    if read < sent * TRUNCATED_SHARE:
        return [
            f"server read {read:,} prompt tokens, we sent {approx}{sent:,}: "
            "the prompt was probably truncated"
        ]
    return []
