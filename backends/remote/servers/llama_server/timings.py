"""llama-server's own fields on a chunk of its stream, and the labels its figures are
kept under: `prompt_progress` (with `return_progress`: the prefill as it goes) and, on
the final chunk, `timings` (its slot's own account of the request: tools/server/
server-common.cpp, server_slot_stats::to_json). Both are read from any server that
sends them, whatever its listing claimed (a proxy passes them through); its
`ServerFamily.progress` and `.timings` hooks, called by backends/remote/openai_wire.py.

The local engine counts the same figures with llama.cpp's own counters, in the same
shape (backends/local/llama_glue.py): an answer's `Metrics.server_source` says which it was
(`source`), and a line shows who says them (`SAID_BY`)."""

from __future__ import annotations

from typing import Any

from phasechat.backends.events import PrefillProgress, ServerTimings, Usage
from phasechat.backends.remote.wire_numbers import Fields

#: the label of a stream's `timings` (kept in saved answers: never renamed)
SOURCE = "timings"
#: the label of the local engine's counters, in the same shape
LOCAL_SOURCE = "llama.cpp"
#: who says each label's figures, as a line names them (telemetry/verdict.py)
SAID_BY = {SOURCE: "the server", LOCAL_SOURCE: "llama.cpp"}


def source(local: bool) -> str:
    """The label of an answer's timings: the local engine's (`local`) or a stream's."""
    return LOCAL_SOURCE if local else SOURCE


def progress(chunk: dict[str, Any], f: Fields) -> PrefillProgress | None:
    """`prompt_progress`: dropped whole when a number is not plausible."""
    said = chunk.get("prompt_progress")
    if not isinstance(said, dict):
        return None
    total = f.count(said, "total", "prompt_progress")
    cache = f.count(said, "cache", "prompt_progress")
    done = f.count(said, "processed", "prompt_progress")
    time_ms = f.ms(said, "time_ms", "prompt_progress")
    cache = f.at_most(cache, total, "prompt_progress.cache", "prompt_progress.total")
    done = f.at_most(done, total, "prompt_progress.processed", "prompt_progress.total")
    if total is None or cache is None or done is None:
        return None
    return PrefillProgress(total, cache, done, time_ms or 0.0)


def timings(chunk: dict[str, Any], usage: Usage | None, f: Fields) -> ServerTimings | None:
    """`timings` (None: the chunk has none); `usage` from the same chunk bounds what it
    says was read."""
    said = chunk.get("timings")
    if not isinstance(said, dict) or "prompt_n" not in said:
        return None
    prompt_n = f.count(said, "prompt_n", "timings")
    cache_n = f.count(said, "cache_n", "timings")
    total = usage.prompt_tokens if usage is not None else None
    # only with a draft model (llama.cpp tools/server/server-common.cpp,
    # server_slot_stats::to_json: "if (n_draft_tokens > 0)")
    drafted = f.count(said, "draft_n", "timings")
    accepted = f.count(said, "draft_n_accepted", "timings")
    return ServerTimings(
        f.at_most(prompt_n, total, "timings.prompt_n", "usage.prompt_tokens"),
        f.ms(said, "prompt_ms", "timings"),
        f.count(said, "predicted_n", "timings"),
        f.ms(said, "predicted_ms", "timings"),
        f.at_most(cache_n, total, "timings.cache_n", "usage.prompt_tokens"),
        drafted,
        f.at_most(accepted, drafted, "timings.draft_n_accepted", "timings.draft_n"),
    )
