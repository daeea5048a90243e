"""Thinking models over the remote backend: the chain of thought streamed apart from the
answer, in llama-server's and vLLM's shapes (each shape's source lines are cited in
tests/fault_think.py), through the session and the `ask --json` command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phasechat.backends.events import ReasoningDelta, TextDelta, Usage
from phasechat.backends.remote.openai_wire import parse_chunk
from tests.fault_server import fault_server_thread
from tests.test_faults import ask

ROOT = Path(__file__).resolve().parent.parent


def test_llama_server_chunks_parse_to_reasoning_then_text() -> None:
    # One diff holding both (the token that closes the think block): reasoning first,
    # as tools/server/server-chat.cpp:621-627 builds the delta.
    data = (
        '{"choices":[{"finish_reason":null,"index":0,"delta":'
        '{"reasoning_content":"so 2","content":"Four."}}],"object":"chat.completion.chunk"}'
    )
    assert parse_chunk(data) == [ReasoningDelta("so 2"), TextDelta("Four.")]
    # The initial update (server-task.cpp:1133-1138) carries no text of either kind.
    first = '{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}'
    assert parse_chunk(first) == []


def test_vllm_chunks_and_usage_parse() -> None:
    data = '{"choices":[{"index":0,"delta":{"reasoning":"hmm "},"finish_reason":null}]}'
    assert parse_chunk(data) == [ReasoningDelta("hmm ")]
    usage = (
        '{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":50,"total_tokens":59,'
        '"completion_tokens_details":{"reasoning_tokens":40}}}'
    )
    assert parse_chunk(usage) == [Usage(9, 50, None, 40)]


@pytest.mark.parametrize("shape", ["think", "thinkvllm"])
async def test_thinking_is_kept_apart_and_timed(shape: str) -> None:
    from tests.fault_server import FaultServer

    async with FaultServer() as server:
        ex, _ = await ask(server.base_url, f"{shape}-40-10-2", stall_timeout_s=5)
    m = ex.metrics
    assert m is not None and ex.answer.status == "complete"
    assert ex.answer.reasoning == "".join(f"think{i} " for i in range(40))
    assert ex.answer.content == "".join(f"ans{i} " for i in range(10))
    # TTFT is the first token of any kind; TTFO the first answer token.
    assert m.ttft_ms is not None and m.ttfo_ms is not None and m.e2e_ms is not None
    assert m.ttft_ms < m.ttfo_ms <= m.e2e_ms
    assert ex.trace.t_first_token == ex.trace.t_first_reasoning
    # The thinking phase runs from the first token to the first answer token.
    assert m.reasoning_ms is not None and m.reasoning_ms > 0
    assert m.reasoning_ms == pytest.approx(m.ttfo_ms - m.ttft_ms)
    # Every generated token over the whole decode window, not the answer's alone.
    t = ex.trace
    assert t.t_first_token is not None and t.t_last_token is not None
    window_s = (t.t_last_token - t.t_first_token) / 1e9
    assert m.output_tokens == 50
    assert m.decode_tok_s == pytest.approx(49 / window_s)
    if shape == "thinkvllm":  # the server counts the thinking
        assert (m.reasoning_tokens, m.reasoning_tokens_source, m.answer_tokens) == (
            40,
            "server",
            10,
        )
    else:  # llama-server does not: its exact total, split by a tiktoken estimate
        # cl100k_base reads the thinking as 81 tokens and the answer as 21, so the split
        # is round(50 x 81 / 102) = 40: the stream's true 40, exactly
        assert m.reasoning_tokens_source == "estimate"
        assert (m.reasoning_tokens, m.answer_tokens) == (40, 10)


async def test_a_think_longer_than_the_first_token_timeout_is_progress() -> None:
    from tests.fault_server import FaultServer

    # Thinking tokens every 50 ms for 1 s; the first-token and stall deadlines are 0.3 s.
    async with FaultServer() as server:
        ex, _ = await ask(server.base_url, "thinkslow-50-1", first_token_timeout_s=0.3)
    assert ex.answer.status == "complete", ex.answer.error
    assert ex.answer.reasoning.count("think") == 20 and ex.answer.content


async def test_no_token_at_all_is_still_a_timeout() -> None:
    from tests.fault_server import FaultServer

    async with FaultServer() as server:
        ex, _ = await ask(server.base_url, "slowstart-2", first_token_timeout_s=0.3)
    assert ex.answer.status == "error" and ex.answer.error == "no token within 0.3 s"


def test_ask_json_carries_reasoning_and_its_figures() -> None:
    with fault_server_thread() as server:
        url = ["--base-url", server.base_url, "--model", "thinkvllm-40-10-2"]
        r = subprocess.run(
            [sys.executable, "-m", "phasechat", "ask", "--json", "--backend", "openai", *url, "hi"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["reasoning"].startswith("think0 ") and out["text"].startswith("ans0 ")
    assert out["reasoning_tokens"] == 40 and out["answer_tokens"] == 10
    assert out["ttft_ms"] < out["ttfo_ms"] <= out["e2e_ms"]
    assert out["reasoning_ms"] > 0
