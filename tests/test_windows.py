"""A remote server's context window (backends/windows.py), asked of servers shaped like
llama-server, vLLM and Ollama (tests/shaped.py), each serving more than one model or
saying more than one number, so that reading the wrong one shows."""

from __future__ import annotations

import json
from typing import Any

from phasechat.backends.windows import context_refusal
from tests.shaped import Shaped

LLAMA_MODELS = [  # an older llama-server: meta has the trained size, not the slot's window
    {"id": "smollm2", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192}}
]


async def window_of(
    models: list[dict[str, Any]], model: str, routes: dict[str, Any] | None = None
) -> tuple[Any, ...]:
    """(tokens, source, slots) of the window `RemoteBackend.start` finds for `model`."""
    server = Shaped(models, lambda req: b"", routes)
    backend = server.backend(model=model)
    await backend.start()
    window = backend.window
    await backend.aclose()
    assert window is not None
    return window.tokens, window.source, window.slots


async def test_llama_server_props_give_one_slots_window_and_the_slot_count() -> None:
    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4}
    # each of the 4 slots holds 4,096 tokens: a chat gets 4,096, not 16,384
    assert await window_of(LLAMA_MODELS, "smollm2", {"/props": props}) == (
        4096,
        "llama-server /props",
        4,
    )


async def test_vllm_gives_the_window_of_the_model_asked_for() -> None:
    models = [
        {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm", "max_model_len": 32768},
        {"id": "Qwen/Qwen3-0.6B", "object": "model", "owned_by": "vllm", "max_model_len": 8192},
    ]
    assert await window_of(models, "Qwen/Qwen3-0.6B") == (
        8192,
        "vLLM /v1/models max_model_len",
        None,
    )
    assert (await window_of(models, "Qwen/Qwen3-8B"))[0] == 32768


async def test_ollama_gives_the_window_of_the_loaded_model_asked_for() -> None:
    models = [
        {"id": "qwen3:8b", "object": "model", "owned_by": "library"},
        {"id": "llama3.2:1b", "object": "model", "owned_by": "library"},
    ]
    ps = {
        "models": [
            {"name": "qwen3:8b", "model": "qwen3:8b", "context_length": 40960},
            {"name": "llama3.2:1b", "model": "llama3.2:1b", "context_length": 2048},
        ]
    }
    assert await window_of(models, "llama3.2:1b", {"/api/ps": ps}) == (
        2048,
        "Ollama /api/ps context_length",
        None,
    )


def test_a_llama_server_refusal_in_words_gives_the_window_and_the_prompt() -> None:
    text = (
        "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it"
    )
    assert context_refusal(text) == {"n_ctx": 4096, "n_prompt_tokens": 5000}
    body = json.dumps(
        {"error": {"code": 400, "message": text, "type": "exceed_context_size_error"}}
    )
    assert context_refusal(body) == {"n_ctx": 4096, "n_prompt_tokens": 5000}
