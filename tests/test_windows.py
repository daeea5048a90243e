"""A remote server's context window (backends/remote/windows.py), asked of servers shaped like
llama-server, vLLM and Ollama (tests/shaped.py), each serving more than one model or
saying more than one number, so that reading the wrong one shows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from phasechat.backends.remote.servers import context_refusal, from_models
from phasechat.backends.remote.servers.llama_server import props_window
from phasechat.backends.remote.urls import root_of
from phasechat.backends.remote.windows import Window
from tests.shaped import Shaped

LLAMA_MODELS = [  # an older llama-server: meta has the trained size, not the slot's window
    {"id": "smollm2", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192}}
]


async def window_of(
    models: list[dict[str, Any]], model: str, routes: dict[str, Any] | None = None
) -> tuple[Any, ...]:
    """(tokens, source, slots) of the window `RemoteBackend.start` finds for `model`
    (a server with Ollama's endpoints answers its `/api/version` too)."""
    if routes and any(path.startswith("/api/") for path in routes):
        routes = {**routes, "/api/version": {"version": "0.0.0"}}
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


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # vLLM: the window first, then the prompt; not swapped
        (
            json.dumps({"error": {"message": "This model's maximum context length is 2048 "
                                  "tokens. However, you requested 2100 tokens (2000 in the "
                                  "messages, 100 in the completion)."}}),
            {"n_ctx": 2048, "n_prompt_tokens": 2100},
        ),
        # llama-server with a zero n_ctx field (not a size): both sizes from its words
        (
            json.dumps({"error": {"type": "exceed_context_size_error", "n_ctx": 0,
                                  "n_prompt_tokens": 300, "message": "request (7 tokens) "
                                  "exceeds the available context size (256 tokens)"}}),
            {"n_prompt_tokens": 7, "n_ctx": 256},
        ),
        (
            json.dumps({"error": {"type": "exceed_context_size_error", "n_ctx": 512,
                                  "n_prompt_tokens": 600}}),
            {"n_ctx": 512, "n_prompt_tokens": 600},
        ),
        # OpenAI: it does not fit, sizes unsaid
        (json.dumps({"error": {"code": "context_length_exceeded", "message": "too long"}}), {}),
        (json.dumps({"error": {"code": "rate_limit_exceeded", "message": "slow down"}}), None),
        ("internal server error", None),
    ],
)  # fmt: skip
def test_a_refusal_gives_the_window_and_the_prompt_each_in_its_place(
    body: str, expected: dict[str, object] | None
) -> None:
    assert context_refusal(body) == expected


def test_the_listing_gives_the_window_of_the_model_asked_for_else_the_first() -> None:
    entries = [
        {"id": "a", "max_model_len": 1000},
        {"id": "b", "meta": {"n_ctx": 0}, "max_model_len": 2000},
        {"id": "c", "meta": {"n_ctx": 3000}, "max_model_len": 4000},
    ]
    found = [from_models(entries, model) for model in ("c", "b", "zz")]
    assert [(w.tokens, w.source) if w else None for w in found] == [
        (3000, "llama-server /v1/models meta.n_ctx"),
        (2000, "vLLM /v1/models max_model_len"),
        (1000, "vLLM /v1/models max_model_len"),
    ]
    assert from_models([], "a") is None
    assert from_models([{"id": "a", "max_model_len": 0}], "a") is None


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://h:8080/v1", "http://h:8080"),
        ("http://h:8080/v1/", "http://h:8080"),
        ("http://h:8080/", "http://h:8080"),
        ("http://h:8080/api/v1x", "http://h:8080/api/v1x"),
    ],
)
def test_the_server_s_root_drops_only_a_final_v1(url: str, root: str) -> None:
    assert root_of(url) == root


async def test_llama_servers_props_come_before_the_listings_meta() -> None:
    # the listing's meta.n_ctx (8,192) disagrees with /props (4,096 a slot): /props,
    # the running server's own settings, wins, with its slot count
    models = [{"id": "smollm2", "owned_by": "llamacpp", "meta": {"n_ctx": 8192}}]
    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2}
    assert await window_of(models, "smollm2", {"/props": props}) == (
        4096,
        "llama-server /props",
        2,
    )
    # without /props the listing's meta is the window
    assert await window_of(models, "smollm2") == (8192, "llama-server /v1/models meta.n_ctx", None)


@pytest.mark.parametrize(
    "parameters",
    [
        'stop "<|im_start|>"\nstop "<|im_end|>"\nnum_ctx 8192\ntemperature 0.7',
        "num_ctx 8192",
        "temperature 0.7\nnum_ctx                        8192",
    ],
)
async def test_ollamas_num_ctx_is_found_on_any_parameter_line(parameters: str) -> None:
    models = [{"id": "qwen3:8b", "object": "model", "owned_by": "library"}]
    show = {"parameters": parameters, "model_info": {"qwen3.context_length": 40960}}
    # not loaded: /api/ps lists no model; the Modelfile's num_ctx, not the trained 40,960
    routes = {"/api/ps": {"models": []}, "/api/show": show}
    assert await window_of(models, "qwen3:8b", routes) == (8192, "Ollama /api/show num_ctx", None)


async def test_props_say_the_window_the_slots_and_whether_metrics_are_served() -> None:
    props = {
        "default_generation_settings": {"n_ctx": 4096},
        "total_slots": 3,
        "endpoint_metrics": True,
    }

    def handle(request: httpx.Request) -> httpx.Response:
        return (
            httpx.Response(200, json=props) if request.url.path == "/props" else httpx.Response(404)
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        got = await props_window(client, "http://h", {}, "", None)
        assert got == Window(4096, "llama-server /props", 3, True)
        props["endpoint_metrics"] = "yes"  # not a JSON true
        props["total_slots"] = 0
        assert await props_window(client, "http://h", {}, "", None) == Window(
            4096, "llama-server /props", None, False
        )
        props["default_generation_settings"] = {"n_ctx": 0}
        assert await props_window(client, "http://h", {}, "", None) is None


async def test_ollamas_running_window_is_the_one_of_the_model_asked_for_only() -> None:
    models = [{"id": "qwen3:8b", "object": "model", "owned_by": "library"}]
    # another model is loaded (its 2,048 is not ours): the Modelfile's num_ctx
    ps = {"models": [{"name": "llama3.2:1b", "model": "llama3.2:1b", "context_length": 2048}]}
    show = {"parameters": "num_ctx 8192"}
    assert await window_of(models, "qwen3:8b", {"/api/ps": ps, "/api/show": show}) == (
        8192,
        "Ollama /api/show num_ctx",
        None,
    )
    # a number of 13 digits is no window
    huge = {"parameters": "num_ctx 1234567890123"}
    server = Shaped(models, lambda req: b"", {"/api/ps": {"models": []}, "/api/show": huge})
    backend = server.backend(model="qwen3:8b")
    await backend.start()
    assert backend.window is None
    await backend.aclose()


async def test_a_server_that_is_not_ollama_is_not_asked_ollamas_endpoints() -> None:
    models = [{"id": "gpt-x", "object": "model", "owned_by": "someone"}]  # no window said
    server = Shaped(models, lambda req: b"", {"/api/ps": {"models": []}})
    backend = server.backend(model="gpt-x")
    await backend.start()
    await backend.aclose()
    assert backend.window is None
    # asked only whether it is Ollama (a 404), never Ollama's window
    asked = {r.url.path for r in server.requests if r.url.path.startswith("/api/")}
    assert asked == {"/api/version"}
    # an Ollama listing that names a window itself: that window, no further question
    listed = [{"id": "q", "object": "model", "owned_by": "ollama", "max_model_len": 4096}]
    server = Shaped(listed, lambda req: b"", {"/api/ps": {"models": []}})
    backend = server.backend(model="q")
    await backend.start()
    await backend.aclose()
    assert backend.window is not None and backend.window.tokens == 4096
    asked = {r.url.path for r in server.requests if r.url.path.startswith("/api/")}
    assert asked <= {"/api/version"}
