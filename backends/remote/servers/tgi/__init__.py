"""Hugging Face's text-generation-inference (TGI; in maintenance mode: supported, not
built on), read against its source (huggingface/text-generation-inference@db931fcf,
router/src/server.rs; tests/standins/tgi.py). Its `/v1/models` names the model as its
owner (`openai_get_model_info`), so it is recognised by `GET /info`, which only TGI's
router answers (`router: "text-generation-router"`), and whose `max_total_tokens` is the
window. What it measured of a request it says in headers only on a reply sent whole
(`generate_internal`: `x-queue-time`, `x-inference-time`, `x-total-time`, whole
milliseconds, `x-compute-time` in seconds); a streamed chat completion, which phasechat
opens, gets only `x-compute-type`, `x-compute-characters` and `X-Accel-Buffering`
(`generate_stream_internal`). Its account of a stream is in the router's `/metrics`
(`tgi_request_queue_duration`, `tgi_request_input_length`, ... recorded at the stream's
end), read before and after the request (backends/remote/server_metrics.py). It reports no
cached prompt tokens, and its `tgi_request_inference_duration` runs from the batch's
start to the last token (prefill and decode together): neither is shown."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from phasechat.backends.events import ServerAccount
from phasechat.backends.remote.servers.family import PromNames, ServerFamily, checked_window
from phasechat.backends.remote.urls import endpoint
from phasechat.backends.remote.windows import Window, fetch_json
from phasechat.backends.remote.wire_numbers import Fields, as_count, as_ms

#: what `/info`'s `router` says on TGI (router/src/lib.rs `Info`: the crate's name)
ROUTER = "text-generation-router"


def _number(headers: Mapping[str, str], name: str, f: Fields, ms: bool) -> float | None:
    """Header `name` as whole milliseconds (`ms`) or a count; None when absent, or
    (noted) when it is not plain digits of a plausible value."""
    raw = headers.get(name)
    if raw is None:
        return None
    said = raw.strip()
    digits = said.isascii() and said.isdigit() and len(said) <= 12
    value = (as_ms(int(said)) if ms else as_count(int(said))) if digits else None
    if value is None:
        f.ignore(f"header {name}", raw)
    return value


#: The headers of a reply TGI sent whole that time the request (what `header_timing` needs
#: one of; the counts come with them).
TIMING_HEADERS = ("x-queue-time", "x-total-time", "x-inference-time")


def header_timing(headers: Mapping[str, str], f: Fields) -> ServerAccount | None:
    """The request's queue and whole time, and its counts, from the headers of a reply
    TGI sent whole. Its `x-total-time` (validation + queue + inference) ends when the
    reply is whole: the server's own time to the first byte of such a reply."""
    queue, total, inference = (_number(headers, name, f, ms=True) for name in TIMING_HEADERS)
    if queue is None and total is None and inference is None:
        return None
    prompt = _number(headers, "x-prompt-tokens", f, ms=False)
    generated = _number(headers, "x-generated-tokens", f, ms=False)
    return ServerAccount(
        "TGI headers",
        prompt_tokens=int(prompt) if prompt is not None else None,
        generated_tokens=int(generated) if generated is not None else None,
        queue_ms=queue,
        ttft_ms=total,
    )


async def _info(client: httpx.AsyncClient, root: str, headers: dict[str, str]) -> dict[str, object]:
    said = await fetch_json(client, "GET", endpoint(root, "/info"), headers)
    return said if isinstance(said, dict) and said.get("router") == ROUTER else {}


async def identify(client: httpx.AsyncClient, root: str, headers: dict[str, str]) -> bool:
    """Is it TGI's router (`GET /info` says so)?"""
    return bool(await _info(client, root, headers))


async def info_window(
    client: httpx.AsyncClient, root: str, headers: dict[str, str], model: str, f: Fields | None
) -> Window | None:
    """`/info`'s `max_total_tokens`: the most tokens, prompt and answer, of a request."""
    info = await _info(client, root, headers)
    if n := checked_window(info.get("max_total_tokens"), "/info max_total_tokens", f):
        return Window(n, "TGI /info max_total_tokens")
    return None


FAMILY = ServerFamily(
    name="TGI",
    identify=identify,
    own_window=info_window,
    metrics=PromNames(
        engine="TGI",
        prefix="tgi_",
        names={
            # its waiting queue, and its running batch (0 once the batch is done)
            "running": ("tgi_queue_size", "tgi_batch_current_size"),
            "finished": ("tgi_request_success",),
            "prompt": ("tgi_request_input_length_sum",),
            "generated": ("tgi_request_generated_tokens_sum",),
            "queue_s": ("tgi_request_queue_duration_sum",),
        },
    ),
    header_timing=header_timing,
    timing_headers=TIMING_HEADERS,
    docs="huggingface/text-generation-inference: router/src/server.rs",
)
