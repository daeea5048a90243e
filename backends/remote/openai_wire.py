"""The chat-completion wire format: what one streamed `data:` payload, or one whole
non-streamed reply, means as backend events.

Tolerant of what real servers send: OpenAI's `usage` with cached-token details, an
`{"error": ...}` object mid-stream, and a server that ignores `stream: true` and answers
in one JSON body. A server's own fields on a chunk (llama-server's `timings` and
`prompt_progress`, vLLM's `metrics`, Dynamo's `nvext`, ...) are its family's to read
(backends/remote/servers/): this module calls the family's hooks and names none.

A thinking model's chain of thought arrives beside the answer: `reasoning_content`
(llama-server, older vLLM) or `reasoning` (newer vLLM, OpenRouter) in the delta, and
`usage.completion_tokens_details.reasoning_tokens` (vLLM, OpenAI) counts it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from phasechat.backends.events import (
    Event,
    Finished,
    FinishReason,
    Notice,
    ReasoningDelta,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.backends.remote.http_errors import body_text, error_text
from phasechat.backends.remote.servers import chunk_progress, chunk_timings, context_refusal
from phasechat.backends.remote.servers.family import ServerFamily
from phasechat.backends.remote.wire_numbers import NOT_JSON, Fields, load_json
from phasechat.backends.untrusted import as_text

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop"}
_PROMPT_DETAILS = "usage.prompt_tokens_details"
_OUT_DETAILS = "usage.completion_tokens_details"
#: Where servers put the chain of thought, in the order we look.
REASONING_KEYS = ("reasoning_content", "reasoning")


def reasoning_of(delta: dict[str, object]) -> str:
    """The chain-of-thought text of a delta (or message), '' when it has none."""
    for key in REASONING_KEYS:
        value = delta.get(key)
        if isinstance(value, str) and value:
            return as_text(value)
    return ""


def parse_chunk(
    data: str, server: str = "the server", family: ServerFamily | None = None
) -> list[Event]:
    """Events in one `data:` payload of a chat-completion stream, with `family`'s own
    account of the request where the payload has its fields (a `ServerAccount`).
    Numbers that are not plausible are dropped and named in one `Notice` (which names
    `server`)."""
    obj = load_json(data)
    if obj is NOT_JSON:
        return [StreamError("protocol", f"malformed event from server: {data[:80]!r}")]
    if not isinstance(obj, dict):
        return [StreamError("protocol", f"unexpected event from server: {data[:80]!r}")]
    if "error" in obj:
        err = obj["error"]
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) and 100 <= code <= 599 else None
        refusal = context_refusal(data)
        if refusal is not None:  # the prompt does not fit the server's window
            return [StreamError("context_overflow", error_text(obj), False, status, None, refusal)]
        # The server failed mid-answer (a crash, an overload): trying again may work.
        return [StreamError("server", f"server error: {error_text(obj)}", True, status)]
    f = Fields()
    out: list[Event] = []
    if (progress := chunk_progress(obj, f)) is not None:
        out.append(progress)
    choices = obj.get("choices")
    if choices is not None and not isinstance(choices, list):
        f.ignore("choices", choices)
    for choice in choices if isinstance(choices, list) else ():
        out += _choice(choice, f)
    usage = obj.get("usage")
    said = _usage(usage, f) if isinstance(usage, dict) else None
    if said is not None:
        out.append(said)
    if (timings := chunk_timings(obj, said, f)) is not None:
        out.append(timings)
    if family is not None and family.chunk_timing is not None:
        own = family.chunk_timing(obj, f)
        if own is not None:
            out.append(own)
    if (line := f.notice(server)) is not None:
        out.append(Notice(line, doubt=True))
    return out


def _choice(choice: object, f: Fields) -> list[Event]:
    """The text, thinking and finish of one element of `choices`."""
    if not isinstance(choice, dict):
        f.ignore("choices[]", choice)
        return []
    out: list[Event] = []
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        f.ignore("choices[].delta", delta)
        delta = {}
    # llama-server puts reasoning before content when one diff holds both
    # (server-chat.cpp: server_chat_msg_diff_to_json_oaicompat), as it was generated.
    thought = reasoning_of(delta)
    if thought:
        out.append(ReasoningDelta(thought))
    content = delta.get("content")
    if content:
        out.append(TextDelta(as_text(content)))
    reason = choice.get("finish_reason")
    if reason:
        out.append(Finished(_FINISH.get(str(reason), "other")))
    return out


def _usage(usage: dict[str, object], f: Fields) -> Usage:
    """OpenAI's `usage`: each count checked, and the parts no larger than their wholes."""
    prompt = f.count(usage, "prompt_tokens", "usage")
    completion = f.count(usage, "completion_tokens", "usage")
    details = usage.get("prompt_tokens_details")
    cached = (
        f.count(details, "cached_tokens", _PROMPT_DETAILS) if isinstance(details, dict) else None
    )
    out_details = usage.get("completion_tokens_details")
    thought = (
        f.count(out_details, "reasoning_tokens", _OUT_DETAILS)
        if isinstance(out_details, dict)
        else None
    )
    return Usage(
        prompt,
        completion,
        f.at_most(cached, prompt, f"{_PROMPT_DETAILS}.cached_tokens", "usage.prompt_tokens"),
        f.at_most(
            thought, completion, f"{_OUT_DETAILS}.reasoning_tokens", "usage.completion_tokens"
        ),
    )


async def whole_reply(
    response: httpx.Response, ctype: str, server: str = "the server"
) -> AsyncIterator[Event]:
    """A server that ignored `stream: true`: keep its answer, and say so."""
    body = (await response.aread())[: 64 * 1024 * 1024]
    obj = load_json(body)
    try:
        assert isinstance(obj, dict)
        choice = obj["choices"][0]
        text = as_text(choice["message"].get("content") or "")
        thought = reasoning_of(choice["message"])
    except (AssertionError, KeyError, IndexError, TypeError, AttributeError):
        kind = ctype.split(";")[0] or "no content type"
        said = body_text(body[:4000].decode("utf-8", errors="replace"))
        msg = f"server did not stream (sent {kind}, not text/event-stream)"
        yield StreamError("protocol", f"{msg}: {said}" if said else msg)
        return
    yield Notice("the server did not stream: the answer arrived whole, so TTFT = e2e")
    if thought:
        yield ReasoningDelta(thought)
    yield TextDelta(text)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        f = Fields()
        yield _usage(usage, f)
        if (line := f.notice(server)) is not None:
            yield Notice(line, doubt=True)
    reason = choice.get("finish_reason") or "stop"
    yield Finished(_FINISH.get(str(reason), "other"))
