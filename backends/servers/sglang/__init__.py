"""SGLang: `owned_by: sglang`; with `--enable-cache-report` the OpenAI `usage` carries
`prompt_tokens_details.cached_tokens` (read by openai_wire.py as for any server); its
`meta_info` (`queue_time` in seconds, `prompt_tokens`, `cached_tokens`) is the request's
own account; with `--enable-metrics`, `sglang:` counters and histograms at /metrics
(docs.sglang.io, references/production_metrics: `time_to_first_token_seconds`,
`queue_time_seconds`, `cached_tokens_total` by cache source). Its radix cache reuses
any prefix (page size 1 by default): exact."""

from __future__ import annotations

from typing import Any

from phasechat.backends.events import ServerAccount
from phasechat.backends.servers.family import PromNames, ServerFamily, seconds_ms
from phasechat.backends.wire_numbers import Fields


def chunk_timing(chunk: dict[str, Any], f: Fields) -> ServerAccount | None:
    """The chunk's `meta_info`: the request's queue time and its prompt's cache."""
    meta = chunk.get("meta_info")
    if not isinstance(meta, dict):
        return None
    prompt = f.count(meta, "prompt_tokens", "meta_info")
    cached = f.count(meta, "cached_tokens", "meta_info")
    return ServerAccount(
        "SGLang meta_info",
        prompt_tokens=prompt,
        cached_tokens=f.at_most(cached, prompt, "meta_info.cached_tokens", "prompt_tokens"),
        queue_ms=seconds_ms(meta, "queue_time", "meta_info", f),
    )


FAMILY = ServerFamily(
    name="SGLang",
    owned_by=("sglang",),
    metrics=PromNames(
        engine="SGLang",
        prefix="sglang:",
        names={
            "running": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
            "finished": ("sglang:num_requests_total",),
            "prompt": ("sglang:prompt_tokens_total",),
            "cached": ("sglang:cached_tokens_total",),  # summed over device, host, storage
            "generated": ("sglang:generation_tokens_total",),
            "queue_s": ("sglang:queue_time_seconds_sum",),
            "ttft_s": ("sglang:time_to_first_token_seconds_sum",),
            "used_share": ("sglang:token_usage",),
        },
    ),
    cache_grain=1,
    chunk_timing=chunk_timing,
    docs="docs.sglang.io: references/production_metrics, basic_usage/openai_api",
)
