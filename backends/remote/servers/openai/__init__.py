"""The hosted OpenAI API, and the generic OpenAI-compatible server (LM Studio,
llama-cpp-python's server, a proxy): no window in the listing, `usage` with
`prompt_tokens_details.cached_tokens`, and `code: context_length_exceeded` refusals.
Any server no other family claims is treated as this one: nothing is added to its
requests and nothing beyond the OpenAI wire format is read from it."""

from __future__ import annotations

from typing import Any

from phasechat.backends.remote.servers.family import ServerFamily


def refusal(err: dict[str, Any], text: str) -> dict[str, object] | None:
    """OpenAI's `code: context_length_exceeded` (its text gives no sizes we rely on)."""
    return {} if err.get("code") == "context_length_exceeded" else None


FAMILY = ServerFamily(
    name="OpenAI-compatible",
    owned_by=("openai", "system"),
    refusal=refusal,
    docs="platform.openai.com/docs/api-reference/chat",
)
