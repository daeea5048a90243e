"""What one side's KV cache costs: the bytes a token takes in it (the model's geometry,
backends/local/gguf.py, at the side's KV type) and what the cache held after an answer.

Shown per side by `compare --chat` and the compare view: a q4_0 cache holds a token in
18/64 of the bytes of an f16 one, and this is where that ratio is seen beside the speed
and the divergence it buys.
"""

from __future__ import annotations

from phasechat.backends.base import Backend
from phasechat.backends.local.capability import LocalEngine
from phasechat.backends.local.gguf import KV_TYPE_BYTES, KV_TYPE_NAMES
from phasechat.telemetry.metrics import Metrics


def kv_bytes_per_token(backend: Backend) -> int | None:
    """KV-cache bytes one token takes on a local backend, every layer's K and V at its
    KV type (None: a remote backend, or a model not loaded yet)."""
    if not isinstance(backend, LocalEngine) or (g := backend.geometry) is None:
        return None
    config = backend.config
    type_bytes = KV_TYPE_BYTES[KV_TYPE_NAMES.get(config.kv_type, KV_TYPE_NAMES["f16"])]
    return g.kv_bytes(1, config.n_ctx, type_bytes)


def kv_mib(metrics: Metrics | None) -> float | None:
    """The KV cache an answer's engine held at its end, MiB (None: not reported)."""
    if metrics is None or metrics.kv_bytes is None:
        return None
    return metrics.kv_bytes / 2**20


def kv_text(backend: Backend, metrics: Metrics | None) -> str:
    """ "KV 23,040 B/token · 1.4 MiB held", each figure "n/a" where unknown."""
    per, mib = kv_bytes_per_token(backend), kv_mib(metrics)
    per_text = "n/a" if per is None else f"{per:,}"
    mib_text = "n/a" if mib is None else f"{mib:,.2f}"
    return f"KV {per_text} B/token · {mib_text} MiB held"
