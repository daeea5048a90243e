"""NVIDIA Dynamo's frontend: `owned_by: nvidia`; a request with `nvext.extra_fields`
`["worker_id", "timing"]` gets, in its final chunk's `nvext`, the workers that served it
(`worker_id.prefill_worker_id`, `decode_worker_id`: apart under disaggregated serving)
and its timing (`timing.prefill_wait_time_ms` before the prefill began,
`prefill_time_ms`, `ttft_ms` from its receipt, `kv_hit_rate` the router's share of
the prompt found cached) (docs.nvidia.com/dynamo, NVIDIA Request Extensions (nvext)).
Its workers' own Prometheus pages are on other ports: not read."""

from __future__ import annotations

import re
from typing import Any

from phasechat.backends.events import ServerAccount
from phasechat.backends.servers.family import ServerFamily
from phasechat.backends.wire_numbers import Fields, as_count

#: A worker id as shown: digits, or a short name of letters, digits and `-_.:`.
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _worker(said: dict[str, Any], key: str, f: Fields) -> str | None:
    """A worker id from `said[key]` (an id is shown, never obeyed: anything but a plain
    id is noted and unknown)."""
    value = said.get(key)
    if value is None:
        return None
    n = as_count(value, limit=2**64 - 1)
    if n is not None:
        return str(n)
    if isinstance(value, str) and _ID.fullmatch(value):
        return value
    f.ignore(f"nvext.{key}", value)
    return None


def chunk_timing(chunk: dict[str, Any], f: Fields) -> ServerAccount | None:
    """The final chunk's `nvext`: timing, the cache hit and the workers."""
    nvext = chunk.get("nvext")
    if not isinstance(nvext, dict):
        return None
    timing = nvext.get("timing")
    timing = timing if isinstance(timing, dict) else {}
    workers = nvext.get("worker_id")
    workers = workers if isinstance(workers, dict) else timing.get("worker")
    workers = workers if isinstance(workers, dict) else {}
    if not timing and not workers:
        return None
    hit = timing.get("kv_hit_rate")
    share = hit if isinstance(hit, int | float) and not isinstance(hit, bool) else None
    if share is not None and not 0 <= share <= 1:  # NaN fails too
        share = None
    if hit is not None and share is None:
        f.ignore("nvext.timing.kv_hit_rate", hit)
    return ServerAccount(
        "Dynamo nvext",
        queue_ms=f.ms(timing, "prefill_wait_time_ms", "nvext.timing"),
        prefill_ms=f.ms(timing, "prefill_time_ms", "nvext.timing"),
        ttft_ms=f.ms(timing, "ttft_ms", "nvext.timing"),
        kv_hit_share=float(share) if share is not None else None,
        prefill_worker=_worker(workers, "prefill_worker_id", f),
        decode_worker=_worker(workers, "decode_worker_id", f),
    )


FAMILY = ServerFamily(
    name="Dynamo",
    owned_by=("nvidia",),
    request_extras={"nvext": {"extra_fields": ["worker_id", "timing"]}},
    chunk_timing=chunk_timing,
    docs="docs.nvidia.com/dynamo: NVIDIA Request Extensions (nvext)",
)
