"""vLLM: `owned_by: vllm`; `max_model_len` in the listing; "maximum context length is N
tokens" refusals; `vllm:` counters and histograms at /metrics (vLLM 0.32's
`vllm/v1/metrics/loggers.py`), with `cache_config_info` for its KV pool; and, where the
server runs with `--enable-per-request-metrics`, the final usage chunk's `metrics`
(`queue_time_ms`, `time_to_first_token_ms` from scheduling, so the prefill, and
`generation_time_ms`: vllm/entrypoints/generate/base/serving.py,
build_per_request_timing_metrics); its own rendering and tokens of a prompt
(`/tokenize`, `/detokenize`: render.py beside this)."""

from __future__ import annotations

import re
from typing import Any

from phasechat.backends.events import ServerAccount
from phasechat.backends.remote.servers.family import PromNames, ServerFamily, checked_window, sizes
from phasechat.backends.remote.servers.vllm.render import render_on_vllm
from phasechat.backends.remote.servers.vllm.teacher import VLLM_FORCING
from phasechat.backends.remote.windows import Window
from phasechat.backends.remote.wire_numbers import Fields

# vLLM before 0.10: "However, you requested 2100 tokens (...)"; 0.32: "However, your
# prompt contains at least 2049 input tokens" (tests/fixtures/vllm/04-too-long.json)
_LIMIT = re.compile(
    r"maximum context length is (\d{1,12}) tokens.*?\b(\d{1,12}) (?:input )?tokens", re.S
)


def listed_window(entry: dict[str, Any], f: Fields | None) -> Window | None:
    """`max_model_len` of a `/v1/models` entry."""
    if n := checked_window(entry.get("max_model_len"), "max_model_len", f):
        return Window(n, "vLLM /v1/models max_model_len")
    return None


def refusal(err: dict[str, Any], text: str) -> dict[str, object] | None:
    """ "This model's maximum context length is N tokens. However, you requested M"."""
    found = _LIMIT.search(text)
    return sizes(found.group(1), found.group(2)) if found else None


def chunk_timing(chunk: dict[str, Any], f: Fields) -> ServerAccount | None:
    """The final usage chunk's `metrics` (`--enable-per-request-metrics`)."""
    said = chunk.get("metrics")
    if not isinstance(said, dict):
        return None
    return ServerAccount(
        "vLLM per-request metrics",
        queue_ms=f.ms(said, "queue_time_ms", "metrics"),
        prefill_ms=f.ms(said, "time_to_first_token_ms", "metrics"),
        decode_ms=f.ms(said, "generation_time_ms", "metrics"),
    )


FAMILY = ServerFamily(
    name="vLLM",
    owned_by=("vllm",),
    listed_window=listed_window,
    refusal=refusal,
    metrics=PromNames(
        engine="vLLM",
        prefix="vllm:",
        names={
            "running": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
            "finished": ("vllm:e2e_request_latency_seconds_count",),
            "prompt": ("vllm:prompt_tokens_total",),
            "cached": ("vllm:prompt_tokens_cached_total",),
            "generated": ("vllm:generation_tokens_total",),
            "prefill_s": ("vllm:request_prefill_time_seconds_sum",),
            "decode_s": ("vllm:request_decode_time_seconds_sum",),
            "queue_s": ("vllm:request_queue_time_seconds_sum",),
            "ttft_s": ("vllm:time_to_first_token_seconds_sum",),
            "used_share": ("vllm:kv_cache_usage_perc",),  # a share, 0-1, despite the name
        },
        fallbacks={"cached": "vllm:prefix_cache_hits_total"},  # older vLLM: hits in tokens
        pool_info="vllm:cache_config_info",
    ),
    cache_grain=16,  # whole KV blocks (--block-size, 16 by default; /metrics says it)
    chunk_timing=chunk_timing,
    render=render_on_vllm,  # /tokenize and /detokenize: the prompt's sections exact
    forcing=VLLM_FORCING,  # prompt_logprobs: teacher.py beside this
    docs="docs.vllm.ai: Production Metrics; vllm/entrypoints/generate/base/serving.py",
)
