"""Telemetry's local exactness on the real models: KV bytes, UTF-8, llama.cpp's counters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.local.gguf import geometry
from phasechat.backends.local.llama_glue import perf_counters
from phasechat.backends.local.models import default_model_path, gemma3_model_path
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController

pytestmark = pytest.mark.model

KV_LINE = re.compile(r"KV buffer size =\s+([\d.]+) MiB")


def llama_cpp_kv_mib(path: Path, n_ctx: int) -> float:
    """What llama.cpp itself logs for its KV buffers at load (summed over caches)."""
    code = (
        "import llama_cpp, sys; "
        f"llama_cpp.Llama({str(path)!r}, n_ctx={n_ctx}, n_threads=1, verbose=True)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    sizes = [float(m) for m in KV_LINE.findall(r.stderr)]
    assert sizes, r.stderr[-2000:]
    return sum(sizes)


@pytest.mark.parametrize(
    ("model", "n_ctx"),
    [(default_model_path, 2048), (default_model_path, 1024), (gemma3_model_path, 2048)],
)
def test_kv_bytes_equal_what_llama_cpp_allocates(model: object, n_ctx: int) -> None:
    path = model()  # type: ignore[operator]
    g = geometry(path)
    ours = g.kv_bytes(n_ctx, n_ctx) / 2**20
    assert ours == pytest.approx(llama_cpp_kv_mib(path, n_ctx), abs=0.01)


def test_gemma3_geometry_has_sliding_window_layers_and_one_kv_head() -> None:
    g = geometry(gemma3_model_path())
    assert g.n_kv_heads == 1 and g.n_swa_layers == 15 and g.n_layers == 18
    assert g.sliding_window == 512
    # without llama.cpp's full-size SWA cache, the sliding layers hold far fewer cells
    assert g.kv_bytes(2048, 2048, swa_full=False) < g.kv_bytes(2048, 2048)


def test_character_split_across_tokens_comes_out_once(local_backend: LocalBackend) -> None:
    text = "日本語のテキスト 한국어 😀"
    tokens = local_backend._llm.tokenize(text.encode(), add_bos=False, special=False)
    decode = local_backend.token_decoder()
    pieces = [decode(t) for t in tokens] + [decode(None)]
    assert "".join(pieces) == text
    # byte-level BPE splits some of these characters: those tokens yield nothing until
    # the one that completes the character
    assert len(tokens) > len([p for p in pieces if p])
    assert all("\ufffd" not in p for p in pieces)


def test_engine_counters_of_a_fresh_context_start_at_zero(model_path: Path) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(str(model_path), n_ctx=256, n_threads=1, verbose=False)
    try:
        # llama.cpp itself reports each count as at least 1; nothing has run yet
        assert perf_counters(llm) == (0.0, 0.0, 0, 0)
        tokens = llm.tokenize(b"Hello there, how are you")
        llm.eval(tokens)  # one prompt batch (perf_counters waits for it to finish)
        prompt_ms, decode_ms, prompt_n, decode_n = perf_counters(llm)
        assert (prompt_n, decode_n, decode_ms) == (len(tokens), 0, 0.0) and prompt_ms > 0
        llm.eval(tokens[1:2])  # one single-token decode
        prompt_ms, decode_ms, prompt_n, decode_n = perf_counters(llm)
        assert (prompt_n, decode_n) == (len(tokens), 1) and decode_ms > 0
    finally:
        llm.close()


async def test_client_figures_agree_with_llama_cpp_counters(local_backend: LocalBackend) -> None:
    import llama_cpp

    turns = TurnController(local_backend, Settings(max_tokens=32, temperature=0))
    long_prompt = "Summarise: " + "The sea was calm and the light turned slowly. " * 12
    async for _ in turns.send(long_prompt):
        pass
    m = turns.exchanges[-1].metrics
    assert m is not None and m.output_tokens == 32 and m.warnings == ()
    assert m.server_prompt_n == m.evaluated_prompt_tokens  # the same prompt tokens evaluated
    assert m.server_cache_n == m.cached_tokens
    assert m.server_prompt_ms is not None and m.ttft_ms is not None
    # TTFT is the trace's own send-to-first-token span (the first token is stamped on
    # the llama thread, not when the UI reads it), and it holds llama.cpp's whole
    # prefill plus templating, tokenizing and the first sample. How much more than the
    # prefill depends on the machine's load, so it is not bounded here.
    t = turns.exchanges[-1].trace
    assert t.t_first_token is not None
    assert m.ttft_ms == pytest.approx((t.t_first_token - t.t_sent) / 1e6, rel=1e-9)
    assert m.server_prompt_ms <= m.ttft_ms
    # The same decode steps timed from two sides, compared step for step rather than as
    # two rates. Stopped at max_tokens, the engine decoded every token but the last (the
    # last is never fed back): output - 1 one-token decodes, each run after the stamp of
    # the token it reads and finished before the next token's stamp (llama.cpp adds a
    # decode to t_eval when the logits are read). So the engine's decode time lies inside
    # our window, on any machine under any load, and our rate cannot exceed its rate.
    assert m.finish == "length" and m.evaluated_prompt_tokens and m.evaluated_prompt_tokens > 1
    assert m.server_predicted_n == m.output_tokens - 1
    assert t.t_last_token is not None
    window_ms = (t.t_last_token - t.t_first_token) / 1e6
    assert m.decode_tok_s == pytest.approx((m.output_tokens - 1) / window_ms * 1000)
    assert m.server_predicted_ms is not None and m.server_predicted_ms <= window_ms
    assert m.decode_tok_s is not None and m.server_decode_tok_s is not None
    assert m.decode_tok_s <= m.server_decode_tok_s
    # KV bytes against the engine's own account of the sequence's state (which adds a
    # small header): within 0.2%
    engine_bytes = llama_cpp.llama_state_seq_get_size(local_backend._llm.ctx, 0)
    assert m.kv_bytes is not None and m.kv_used_tokens == local_backend._llm.n_tokens
    assert m.kv_bytes <= engine_bytes <= m.kv_bytes * 1.002
