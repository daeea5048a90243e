"""Every number right, or said to be unknown: the cases where a meter is easily wrong.

Unit cases on synthetic traces with known answers, and servers shaped like vLLM and
Ollama (tests/shaped.py) for the shapes no real server here produces on demand.
"""

from __future__ import annotations

import pytest

from phasechat.backends.events import (
    Finished,
    KVStats,
    PrefillProgress,
    PromptEvaluated,
    ServerTimings,
    TextDelta,
    Usage,
)
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.telemetry.forecast import fit_line, forecast, measured_rates
from phasechat.telemetry.live import finished, snapshot
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace
from tests.shaped import (
    OLLAMA_MODELS,
    VLLM_MODELS,
    Shaped,
    answer,
    ollama_answer,
    ollama_routes,
    sse,
)
from tests.shaped import (
    chunk as sse_chunk,
)

MS = 1_000_000


def remote(usage: Usage, ttft_ms: float = 40, **trace: object) -> Trace:
    t = Trace("vllm", "m", **trace)  # type: ignore[arg-type]
    for i in range(5):
        t.observe(TextDelta("word "), int((ttft_ms + i * 10) * MS))
    t.observe(usage, int((ttft_ms + 50) * MS))
    t.observe(Finished("stop"), int((ttft_ms + 51) * MS))
    return t


# -- a server that hides its prefix cache ------------------------------------------------


def test_hidden_cache_leaves_the_prefill_rate_unknown() -> None:
    m = compute(remote(Usage(3000, 5, None)))  # vLLM without prompt-token details
    assert m.prompt_tokens == 3000 and m.ttft_ms == 40
    assert m.prefill_tok_s is None and m.evaluated_prompt_tokens is None
    assert m.cached_tokens is None and not m.cache_reported
    assert m.as_dict()["prefill_tok_s"] is None  # null in JSON, never 75,000 tok/s


def test_a_reported_cache_of_zero_is_a_measurement() -> None:
    m = compute(remote(Usage(3000, 5, 0)))  # OpenAI reports cached_tokens: 0
    assert m.cache_reported and m.evaluated_prompt_tokens == 3000
    assert m.prefill_tok_s == pytest.approx(3000 / 0.040)


def test_rates_from_a_hidden_cache_stay_out_of_every_median() -> None:
    hidden = [compute(remote(Usage(3000, 5, None), ttft_ms=40)) for _ in range(3)]
    rates = measured_rates(hidden, "vllm")
    assert rates.prefill_tok_s is None and rates.overhead_ms == 0.0
    f = forecast(rates, 4000, 0, 64, estimated=True)
    assert f.ttft_ms is None  # not forecast from a guess


async def test_vllm_shaped_stream_end_to_end() -> None:
    usage = {"prompt_tokens": 812, "completion_tokens": 6, "prompt_tokens_details": None}
    server = Shaped(VLLM_MODELS, lambda req: answer(6, usage))
    backend = server.backend()
    await backend.start()
    assert backend.context_window == 32768 and "max_model_len" in (backend.context_source or "")
    turns = TurnController(backend, Settings(max_tokens=16))
    async for _ in turns.send("hello"):
        pass
    m = turns.exchanges[-1].metrics
    assert m is not None and m.prompt_tokens == 812 and m.output_tokens == 6
    assert m.prefill_tok_s is None and not m.cache_reported
    assert m.context_window == 32768 and m.kv_used_tokens == 818 and m.kv_capacity_tokens == 32768
    # in process its chunks come at once, a burst (no decode rate, said) unless the
    # machine is so busy that they do not: that line aside, no warning
    assert m.warnings == ((m.decode_unknown,) if m.decode_unknown else ())
    await backend.aclose()


# -- windows, and prompts cut to fit them ----------------------------------------------


@pytest.mark.parametrize("loaded", [True, False])
async def test_ollama_window_is_the_one_it_runs_with(loaded: bool) -> None:
    server = Shaped(OLLAMA_MODELS, lambda req: b"", ollama_routes(2048, loaded))
    backend = server.backend()
    await backend.start()
    # the running num_ctx, not the trained 131,072
    assert backend.context_window == 2048
    assert backend.context_source == (
        "Ollama /api/ps context_length" if loaded else "Ollama /api/show num_ctx"
    )
    await backend.aclose()


async def test_a_server_that_says_nothing_has_an_unknown_window_the_user_can_set() -> None:
    models = [{"id": "gpt-x", "object": "model", "owned_by": "openai"}]
    server = Shaped(models, lambda req: b"")
    backend = server.backend()
    await backend.start()
    assert backend.context_window is None and backend.context_source is None
    paths = [r.url.path for r in server.requests]
    assert paths == ["/v1/models"]  # no probing of endpoints it does not have
    set_by_user = server.backend(context_window=8192)
    await set_by_user.start()
    assert set_by_user.context_window == 8192 and set_by_user.context_source == "set by the user"


async def test_a_prompt_cut_to_the_servers_window_raises_the_alarm() -> None:
    def reply(request: dict[str, object]) -> bytes:
        # Ollama keeps what fits num_ctx (2048) and reports that as prompt_tokens.
        messages = request["messages"]
        assert isinstance(messages, list)
        words = sum(len(str(m["content"]).split()) for m in messages)
        kept = min(words + 10, 2030)
        return ollama_answer(4, kept)

    server = Shaped(OLLAMA_MODELS, reply, ollama_routes(2048, True))
    backend = server.backend()
    await backend.start()
    for prompt, alarms in (("word " * 3000, 1), ("A short question?", 0)):
        turns = TurnController(backend, Settings(max_tokens=8))
        async for _ in turns.send(prompt):
            pass
        m = turns.exchanges[-1].metrics
        assert m is not None
        # the in-process chunks come in one burst (no decode rate): that line aside
        warned = [w for w in m.warnings if w != m.decode_unknown]
        assert len(warned) == alarms, m.warnings
        if alarms:
            assert "window is 2,048 tokens" in warned[0] and "truncated" in warned[0]
    await backend.aclose()


def test_truncation_without_a_known_window_needs_a_large_gap() -> None:
    cut = compute(remote(Usage(400, 5, None), prompt_estimate=1000))
    assert any("probably truncated" in w for w in cut.warnings)
    other_tokenizer = compute(remote(Usage(850, 5, None), prompt_estimate=1000))
    assert other_tokenizer.warnings == ()


# -- the local engine: exact counts, no false alarms -----------------------------------


def test_a_cached_local_turn_raises_no_alarm() -> None:
    t = Trace("local", "m", prompt_estimate=82, prompt_estimate_exact=True, window=2048)
    t.observe(PromptEvaluated(82, 65, 17), 1 * MS)
    for i in range(8):
        t.observe(TextDelta("ab", 1), (30 + i * 10) * MS)
    t.observe(ServerTimings(17, 20.0, 7, 70.0, 65), 110 * MS)
    t.observe(Finished("length"), 111 * MS)
    m = compute(t)
    assert m.warnings == ()
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_prompt_tokens) == (82, 65, 17)
    assert m.server_cache_n == 65


def test_token_times_are_the_producers_not_the_arrivals() -> None:
    t = Trace("local", "m")
    t.t_sent = 0
    made = [100, 110, 120, 130]  # made 10 ms apart on the llama thread ...
    for i, at in enumerate(made):
        t.observe(TextDelta("x", 1, at * MS), (500 + i // 4) * MS)  # ... read in one burst
    t.observe(Finished("stop"), 501 * MS)
    m = compute(t)
    assert m.ttft_ms == 100 and m.decode_tok_s == pytest.approx(100.0)
    assert m.itl_ms_p50 == pytest.approx(10.0) and m.itl_ms_max == pytest.approx(10.0)


def test_roofline_is_tok_s_times_bytes_read_per_token() -> None:
    t = Trace("local", "m")
    for i in range(11):
        t.observe(TextDelta("x", 1), (100 + i * 10) * MS)  # 100 tok/s
    t.observe(KVStats(500, 2048, 10_000_000, 40_000_000, model_bytes=90_000_000), 201 * MS)
    t.observe(Finished("stop"), 202 * MS)
    m = compute(t)
    # each step reads the weights and the KV cache: 100 x (90 MB + 10 MB) = 10 GB/s
    assert m.implied_bandwidth_gb_s == pytest.approx(10.0)


# -- speculative decoding ------------------------------------------------------------


async def test_speculative_fields_from_llama_server_timings() -> None:
    timings = {"prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 40, "predicted_ms": 200.0,
               "cache_n": 0, "draft_n": 48, "draft_n_accepted": 30}  # fmt: skip
    body = sse(sse_chunk("a "), sse_chunk("b"), sse_chunk(finish="stop", timings=timings))
    models = [{"id": "m", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx": 4096}}]
    backend = Shaped(models, lambda req: body).backend()
    await backend.start()
    assert backend.context_window == 4096
    turns = TurnController(backend, Settings(max_tokens=64))
    async for _ in turns.send("hi"):
        pass
    m = turns.exchanges[-1].metrics
    assert m is not None
    assert (m.server_draft_n, m.server_draft_accepted) == (48, 30)
    assert m.draft_acceptance == pytest.approx(30 / 48)
    await backend.aclose()


# -- one rate for one answer -----------------------------------------------------------


def test_live_counts_chunks_then_the_answer_says_tokens() -> None:
    t = Trace("remote", "m")
    for i in range(4):  # chunks of several tokens each
        t.observe(TextDelta("several tokens here "), (100 + i * 20) * MS)
    live = snapshot(t, 170 * MS)
    assert live.unit == "chunks" and live.tokens == 4
    t.observe(Usage(20, 12, 0), 161 * MS)
    t.observe(Finished("stop"), 162 * MS)
    m = compute(t)
    done = finished(snapshot(t, 200 * MS), m)
    assert done.unit == "tokens" and done.tokens == m.output_tokens == 12
    assert done.decode_tok_s == m.decode_tok_s == pytest.approx(11 / 0.060)
    assert done.chars_per_s == m.chars_per_s


# -- phases that are not prefill -------------------------------------------------------


def test_waiting_for_a_summary_is_its_own_phase_with_its_own_timer() -> None:
    t = Trace("local", "m", prompt_estimate=300)
    t.t_queued = 5_000 * MS  # the machine has been up a while: not counted from zero
    live = snapshot(t, 5_250 * MS)
    assert live.phase == "summary" and live.elapsed_ms == pytest.approx(250.0)
    assert live.ttft_ms is None


def test_prefill_progress_says_what_is_left() -> None:
    t = Trace("local", "m", prompt_estimate=1563)
    t.observe(PromptEvaluated(1563, 51, 1512), 1 * MS)
    t.observe(PrefillProgress(1563, 51, 51 + 512, 2000.0), 2000 * MS)
    live = snapshot(t, 2100 * MS)
    assert live.phase == "prefill" and live.prefill_done == 563
    # 512 evaluated in 2 s: the other 1,000 take about 3.9 s
    assert live.prefill_left_ms == pytest.approx(1000 * 2000.0 / 512)


# -- the forecast's two terms ----------------------------------------------------------


def test_forecast_fits_a_fixed_overhead_and_a_rate() -> None:
    # TTFT = 100 ms + 5 ms per evaluated token, as measured
    points = [(20.0, 200.0), (100.0, 600.0), (400.0, 2100.0)]
    overhead, ms_per_token = fit_line(points) or (0.0, 0.0)
    assert overhead == pytest.approx(100.0) and ms_per_token == pytest.approx(5.0)
    history = [compute(remote(Usage(n + 10, 5, 10), ttft_ms=100 + 5 * n)) for n in (20, 100, 400)]
    rates = measured_rates(history, "vllm")
    assert rates.prefill_tok_s == pytest.approx(200.0) and rates.overhead_ms == pytest.approx(100)
    f = forecast(rates, 30, 10, 8, estimated=False)  # 20 new tokens
    assert f.ttft_ms == pytest.approx(200.0)  # not 100 ms: the overhead is its own term
    assert f.overhead_ms == pytest.approx(100.0) and f.prefill_ms == pytest.approx(100.0)


def test_one_prompt_size_cannot_split_the_overhead() -> None:
    assert fit_line([(50.0, 300.0), (50.0, 310.0)]) is None
    assert fit_line([(50.0, 300.0)]) is None
