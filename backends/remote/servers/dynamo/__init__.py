"""NVIDIA Dynamo's frontend (ai-dynamo, read at 1.6.1 and run for real by the tests):
`owned_by: nvidia`; `context_window` in `GET /v1/models` is its workers' declared
`--max-model-len`, 0 when they declare none (unknown, not an empty window).

A request with `nvext.extra_fields` `["worker_id", "timing"]`
(lib/llm/src/protocols/openai/nvext.rs `NvExtResponseFieldSelection::from_nvext`: nothing
without them) gets `nvext.worker_id` on every chunk and `nvext.timing` on the chunk with
the `finish_reason`. The timing is its `RequestTracker`'s
(lib/llm/src/protocols/common/timing.rs), all from the frontend's receipt of the request:
- `prefill_wait_time_ms`: receipt to `record_prefill_start`, which the KV router calls
  right before it pushes the request to the worker it chose (lib/llm/src/kv_router,
  `dispatch_selection`): the frontend's own tokenizing and routing, no queue;
- `prefill_time_ms`: from that push to the first token: the worker's own queue and its
  prefill together, which Dynamo does not split;
- `ttft_ms`: receipt to the first token, the two above exactly (nothing else between);
- `kv_hit_rate`: the router's overlap in whole KV blocks over the prompt's blocks
  (`RequestTracker::kv_hit_rate`): a prompt shorter than one block (the mocker's default
  is 64 tokens) can share none, so a short chat's second turn reads 0.0, a real reading;
- `request_received_ms` (epoch), `total_time_ms` and `router_queue_depth`: not shown.
Its workers' own Prometheus pages are on other ports: not read."""

from __future__ import annotations

import re
from typing import Any

from phasechat.backends.events import PartMeaning, ServerAccount
from phasechat.backends.remote.servers.family import ServerFamily, checked_window
from phasechat.backends.remote.windows import Window
from phasechat.backends.remote.wire_numbers import Fields, as_count

#: Dynamo's two parts of the wait, under its own meaning (see above).
ROUTING = PartMeaning(
    "frontend: tokenize + route",
    "Dynamo's prefill_wait_time_ms: from the frontend's receipt of the request to its "
    "dispatch to the worker its router chose (tokenizing, routing)",
)
WORKER = PartMeaning(
    "worker: queue + prefill",
    "Dynamo's prefill_time_ms: from the dispatch to the first token (the worker's own "
    "queue and its prefill, not split)",
)

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
    """The `nvext` of the chunk with the `finish_reason`: timing, the cache hit and the
    workers. Every other chunk's `nvext` has the workers alone: not an account (the last
    account read is the request's, and a workers-only one would replace its timing)."""
    nvext = chunk.get("nvext")
    if not isinstance(nvext, dict):
        return None
    timing = nvext.get("timing")
    if not isinstance(timing, dict):
        return None
    workers = nvext.get("worker_id")
    workers = workers if isinstance(workers, dict) else timing.get("worker")
    workers = workers if isinstance(workers, dict) else {}
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
        queue_means=ROUTING,
        prefill_means=WORKER,
    )


def unknown_window(entry: dict[str, Any]) -> str | None:
    """Dynamo's `context_window: 0`: its workers declared no window."""
    if entry.get("context_window") == 0:
        return "Dynamo lists context_window 0: its workers declared no --max-model-len"
    return None


def listed_window(entry: dict[str, Any], f: Fields | None) -> Window | None:
    """The window its workers declared (`context_window`; 0 is none: see `unknown_window`)."""
    if entry.get("owned_by") != "nvidia" or entry.get("context_window") == 0:
        return None
    n = checked_window(entry.get("context_window"), "/v1/models context_window", f)
    return Window(n, "Dynamo /v1/models context_window") if n else None


FAMILY = ServerFamily(
    name="Dynamo",
    owned_by=("nvidia",),
    listed_window=listed_window,
    unknown_window=unknown_window,
    request_extras={"nvext": {"extra_fields": ["worker_id", "timing"]}},
    chunk_timing=chunk_timing,
    docs="github.com/ai-dynamo/dynamo lib/llm/src/protocols (nvext.rs, common/timing.rs)",
)
