"""SGLang (sgl-project/sglang), read against its source (tests/standins/sglang.py pins
the commits). `owned_by: sglang` and `max_model_len` in its `/v1/models`
(protocol.py `ModelCard`). Its stream never carries `meta_info`: serving_chat.py
`_convert_to_internal_request` refuses `return_meta_info` with `stream: true` (400). It
carries, after the content and the chunk with `finish_reason` and `matched_stop`, an
`sglext` chunk (`choices: []`) with `cached_tokens_details` {device, host, storage} where
the request asks `return_cached_tokens_details` (phasechat does), then the usage chunk
(`prompt_tokens_details.cached_tokens` with `--enable-cache-report`, and only when more
than 0 were cached: usage_processor.py `_details_if_cached`). The request's queue and
time to first token exist only as histograms at /metrics with `--enable-metrics`
(metrics/collector.py: `sglang:queue_time_seconds` from the waiting queue to the first
forward pass, `sglang:time_to_first_token_seconds` from the request's receipt), read
before and after the request (backends/remote/server_metrics.py). Its prefill apart from the
queue it does not say. Its radix cache reuses any prefix (page size 1 by default): exact."""

from __future__ import annotations

from typing import Any

from phasechat.backends.events import ServerAccount
from phasechat.backends.remote.servers.family import PromNames, ServerFamily, checked_window
from phasechat.backends.remote.windows import Window
from phasechat.backends.remote.wire_numbers import Fields

#: where a cached token was found (protocol.py `CachedTokensDetails`; `storage` only
#: with an L3 storage backend)
_TIERS = ("device", "host", "storage")


def listed_window(entry: dict[str, Any], f: Fields | None) -> Window | None:
    """`max_model_len` of a `/v1/models` entry (protocol.py `ModelCard`)."""
    if n := checked_window(entry.get("max_model_len"), "max_model_len", f):
        return Window(n, "SGLang /v1/models max_model_len")
    return None


def chunk_timing(chunk: dict[str, Any], f: Fields) -> ServerAccount | None:
    """The `sglext` chunk's `cached_tokens_details`: the prompt tokens found cached, on
    the GPU, in host memory and in storage together (bounded by the prompt where the
    account is joined: backends/remote/server_metrics.py)."""
    ext = chunk.get("sglext")
    details = ext.get("cached_tokens_details") if isinstance(ext, dict) else None
    if not isinstance(details, dict):
        return None
    counts = [f.count(details, tier, "sglext.cached_tokens_details") for tier in _TIERS]
    said = [n for tier, n in zip(_TIERS, counts, strict=True) if tier in details]
    if not said or None in said:
        return None  # a tier not believed (named in `f`): the whole is unknown
    return ServerAccount("SGLang sglext", cached_tokens=sum(n for n in said if n is not None))


FAMILY = ServerFamily(
    name="SGLang",
    owned_by=("sglang",),
    listed_window=listed_window,
    metrics=PromNames(
        engine="SGLang",
        prefix="sglang:",
        names={
            "running": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
            "finished": ("sglang:num_requests_total",),
            "prompt": ("sglang:prompt_tokens_total",),
            "cached": ("sglang:cached_tokens_total",),  # counted only when > 0
            "generated": ("sglang:generation_tokens_total",),
            "queue_s": ("sglang:queue_time_seconds_sum",),
            "ttft_s": ("sglang:time_to_first_token_seconds_sum",),
            "used_share": ("sglang:token_usage",),
        },
        absent=(
            "no Prometheus page (SGLang serves /metrics only when it runs with "
            "--enable-metrics): its queue and time to first token are unknown"
        ),
    ),
    request_extras={"return_cached_tokens_details": True},
    cache_grain=1,
    chunk_timing=chunk_timing,
    docs="sgl-project/sglang: entrypoints/openai/serving_chat.py, metrics/collector.py",
)
