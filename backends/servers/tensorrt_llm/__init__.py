"""NVIDIA TensorRT-LLM's `trtllm-serve`: `owned_by: tensorrt_llm`; its Prometheus page
at `/prometheus/metrics`, not /metrics (nvidia.github.io/TensorRT-LLM, examples/
prometheus_metrics: `trtllm_` names; `tensorrt_llm/metrics/collector.py`), with each
request's queue, prefill and decode time as histograms; KV-cache reuse in whole blocks
(`tokens_per_block`, 32 by default)."""

from __future__ import annotations

from phasechat.backends.servers.family import PromNames, ServerFamily

FAMILY = ServerFamily(
    name="TensorRT-LLM",
    owned_by=("tensorrt_llm",),
    metrics=PromNames(
        engine="TensorRT-LLM",
        prefix="trtllm_",
        path="/prometheus/metrics",
        names={
            "finished": ("trtllm_e2e_request_latency_seconds_count",),
            "queue_s": ("trtllm_request_queue_time_seconds_sum",),
            "prefill_s": ("trtllm_request_prefill_time_seconds_sum",),
            "decode_s": ("trtllm_request_decode_time_seconds_sum",),
            "ttft_s": ("trtllm_time_to_first_token_seconds_sum",),
        },
    ),
    cache_grain=32,
    docs="nvidia.github.io/TensorRT-LLM: commands/trtllm-serve, examples/prometheus_metrics",
)
