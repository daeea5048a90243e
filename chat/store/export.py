"""A chat as Markdown or JSON.

Model output is data: in Markdown every control character is made visible
(`chat.text.visible_controls`), so `cat chat.md` cannot recolour the terminal, set its
title or write the clipboard. JSON keeps the text exact; JSON escapes C0 controls itself,
and the C1 block and DEL are escaped here too, so printing it is just as safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import INTERRUPTED, ChatSummary
from phasechat.chat.text import visible_controls
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.records import dumps

FORMATS = ("md", "json")


def to_json(
    chat: ChatSummary, conversation: Conversation, ids: Mapping[int, int] | None = None
) -> str:
    """The chat as one JSON document: its details, then every message of every branch
    (oldest first, each with its `id` and `parent_id`: the tree; the system prompts are
    the roots), with its backend, model, status, error and (answers) the metrics record;
    `branch` lists the ids of the branch shown, root to `leaf_id`.

    `ids` maps `ChatMessage.id` to the id to write (a saved chat's rows, as `ask --json`
    and `chats export` name them); by default, the in-memory ids."""

    def id_of(message_id: int | None) -> int | None:
        if message_id is None:
            return None
        return ids.get(message_id, message_id) if ids is not None else message_id

    path = conversation.path()
    doc: dict[str, Any] = {
        **chat.as_dict(),  # its "messages" count gives way to the messages themselves
        "system": conversation.system,
        "leaf_id": id_of(conversation.leaf),
        "branch": [id_of(m.id) for m in path],
        "messages": [
            {"id": id_of(m.id), "parent_id": id_of(m.parent), **_message_dict(m)}
            for m in conversation.every()
        ],
    }
    return dumps(doc, indent=2)


def _message_dict(m: ChatMessage) -> dict[str, Any]:
    d: dict[str, Any] = {"role": m.role, "content": m.content, "status": m.status}
    if m.role == "assistant":
        metrics = m.metrics.as_dict() if m.metrics is not None else None
        d.update(backend=m.backend, model=m.model, error=m.error, metrics=metrics)
        if m.anatomy is not None:  # the prompt it answered, by section
            d.update(m.anatomy.as_dict())
        if m.reasoning:
            d["reasoning"] = m.reasoning
    return d


def to_markdown(chat: ChatSummary, conversation: Conversation) -> str:
    """The chat as Markdown: a heading per message, answers with their backend, model,
    how they ended and a one-line metrics summary."""
    v = visible_controls
    out = [f"# {v(chat.title)}", ""]
    started = f"{chat.created:%Y-%m-%d %H:%M} UTC" if chat.created else "unknown"
    out.append(f"*chat {chat.id} · started {started}*")
    if conversation.system:
        out += ["", "> **System:** " + v(conversation.system).replace("\n", "\n> ")]
    for m in conversation.messages:
        if m.role == "user":
            out += ["", "## User", ""]
        elif m.role == "system":  # a stray one inside the branch, kept where it was
            out += ["", "## System", ""]
        else:
            source = " · ".join(v(x) for x in (m.backend, _short_model(m.model)) if x)
            out += ["", f"## Assistant ({source})" if source else "## Assistant", ""]
        if m.reasoning:  # folded, as in the chat: a reader opens it if they want it
            thought = v(m.reasoning.strip()).replace("\n", "\n> ")
            out += [
                "<details><summary>Thinking</summary>",
                "",
                f"> {thought}",
                "",
                "</details>",
                "",
            ]
        out.append(v(m.content) if m.content else "*(no text)*")
        if m.role != "assistant":
            continue
        ending = _ending(m)
        if ending:
            out += ["", f"*{v(ending)}*"]
        summary = metrics_line(m.metrics)
        if summary:
            out += ["", f"<sub>{summary}</sub>"]
    return "\n".join(out) + "\n"


def _short_model(model: str | None) -> str | None:
    # A local model is a path; its file name is what the reader recognises.
    return model.rsplit("/", 1)[-1] if model else None


def _ending(m: ChatMessage) -> str:
    if m.status == "error":
        return f"error: {m.error or 'the answer failed'}"
    if m.error == INTERRUPTED:
        return "interrupted: phasechat stopped before this answer finished"
    if m.status == "cancelled":
        return "stopped by the user"
    if m.status == "streaming":
        return "still streaming when exported"
    return ""


def metrics_line(m: Metrics | None) -> str:
    """A one-line summary of an answer's metrics ('' when there are none); a figure
    whose stored value was not believed (`Metrics.ignored`) reads "unknown"."""
    if m is None:
        return ""
    figures = [  # (field, value, as shown, as shown when the value was not believed)
        ("ttft_ms", m.ttft_ms, "TTFT {:.0f} ms", "TTFT unknown"),
        ("reasoning_ms", m.reasoning_ms, "thinking {:.0f} ms", "thinking unknown"),
        ("reasoning_tokens", m.reasoning_tokens, "{} thinking tokens", "thinking tokens unknown"),
        ("prefill_tok_s", m.prefill_tok_s, "prefill {:.0f} tok/s", "prefill unknown"),
        ("decode_tok_s", m.decode_tok_s, "decode {:.1f} tok/s", "decode unknown"),
        ("output_tokens", m.output_tokens, "{} tokens", "tokens unknown"),
        ("e2e_ms", m.e2e_ms, "total {:.0f} ms", "total unknown"),
    ]
    ignored = {line.split(" ", 1)[0] for line in m.ignored}
    shown = [
        fmt.format(value) if value is not None else unknown
        for name, value, fmt, unknown in figures
        if value is not None or name in ignored
    ]
    return " · ".join(shown)
