"""The chat-completion wire format: what one streamed `data:` payload, or one whole
non-streamed reply, means as backend events.

Tolerant of what real servers send: llama-server's `timings` and `prompt_progress`,
OpenAI's `usage` with cached-token details, an `{"error": ...}` object mid-stream, and a
server that ignores `stream: true` and answers in one JSON body.

A thinking model's chain of thought arrives beside the answer: `reasoning_content`
(llama-server, older vLLM) or `reasoning` (newer vLLM, OpenRouter) in the delta, and
`usage.completion_tokens_details.reasoning_tokens` (vLLM, OpenAI) counts it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from phasechat.backends.events import (
    Event,
    Finished,
    FinishReason,
    Notice,
    PrefillProgress,
    ReasoningDelta,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.backends.http_errors import body_text, error_text
from phasechat.backends.windows import context_refusal

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop"}
#: Where servers put the chain of thought, in the order we look.
REASONING_KEYS = ("reasoning_content", "reasoning")


def reasoning_of(delta: dict[str, object]) -> str:
    """The chain-of-thought text of a delta (or message), '' when it has none."""
    for key in REASONING_KEYS:
        value = delta.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def parse_chunk(data: str) -> list[Event]:
    """Events in one `data:` payload of a chat-completion stream."""
    try:
        obj = json.loads(data)
    except ValueError:
        return [StreamError("protocol", f"malformed event from server: {data[:80]!r}")]
    if not isinstance(obj, dict):
        return [StreamError("protocol", f"unexpected event from server: {data[:80]!r}")]
    if "error" in obj:
        err = obj["error"]
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) else None
        refusal = context_refusal(data)
        if refusal is not None:  # the prompt does not fit the server's window
            return [StreamError("context_overflow", error_text(obj), False, status, None, refusal)]
        # The server failed mid-answer (a crash, an overload): trying again may work.
        return [StreamError("server", f"server error: {error_text(obj)}", True, status)]
    out: list[Event] = []
    progress = obj.get("prompt_progress")
    if isinstance(progress, dict):
        out.append(
            PrefillProgress(
                int(progress.get("total", 0)),
                int(progress.get("cache", 0)),
                int(progress.get("processed", 0)),
                float(progress.get("time_ms", 0.0)),
            )
        )
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        # llama-server puts reasoning before content when one diff holds both
        # (server-chat.cpp: server_chat_msg_diff_to_json_oaicompat), as it was generated.
        thought = reasoning_of(delta)
        if thought:
            out.append(ReasoningDelta(thought))
        content = delta.get("content")
        if content:
            out.append(TextDelta(str(content)))
        reason = choice.get("finish_reason")
        if reason:
            out.append(Finished(_FINISH.get(str(reason), "other")))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        out_details = usage.get("completion_tokens_details") or {}
        thought_n = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
        out.append(
            Usage(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                int(cached) if cached is not None else None,
                int(thought_n) if isinstance(thought_n, int | float) else None,
            )
        )
    timings = obj.get("timings")
    if isinstance(timings, dict) and "prompt_n" in timings:
        out.append(
            ServerTimings(
                int(timings.get("prompt_n", 0)),
                float(timings.get("prompt_ms", 0.0)),
                int(timings.get("predicted_n", 0)),
                float(timings.get("predicted_ms", 0.0)),
                int(timings["cache_n"]) if "cache_n" in timings else None,
                # only with a draft model (llama.cpp tools/server/server-common.cpp,
                # server_slot_stats::to_json: "if (n_draft_tokens > 0)")
                _int_or_none(timings.get("draft_n")),
                _int_or_none(timings.get("draft_n_accepted")),
            )
        )
    return out


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def whole_reply(response: httpx.Response, ctype: str) -> AsyncIterator[Event]:
    """A server that ignored `stream: true`: keep its answer, and say so."""
    body = (await response.aread())[: 64 * 1024 * 1024]
    try:
        obj = json.loads(body)
        choice = obj["choices"][0]
        text = str(choice["message"].get("content") or "")
        thought = reasoning_of(choice["message"])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        kind = ctype.split(";")[0] or "no content type"
        said = body_text(body[:4000].decode("utf-8", errors="replace"))
        msg = f"server did not stream (sent {kind}, not text/event-stream)"
        yield StreamError("protocol", f"{msg}: {said}" if said else msg)
        return
    yield Notice("the server did not stream: the answer arrived whole, so TTFT = e2e")
    if thought:
        yield ReasoningDelta(thought)
    yield TextDelta(text)
    if isinstance(obj.get("usage"), dict):
        for event in parse_chunk(json.dumps({"usage": obj["usage"]})):
            yield event
    reason = choice.get("finish_reason") or "stop"
    yield Finished(_FINISH.get(str(reason), "other"))
