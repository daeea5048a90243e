"""The meter on the real bundled model: a healthy chat raises no alarm, a long prefill
reports its progress, and an answer cut inside a character ends cleanly."""

from __future__ import annotations

import pytest

from phasechat.backends.events import PrefillProgress, PromptEvaluated, TextDelta
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController

pytestmark = pytest.mark.model

QUESTIONS = [
    "Name a colour.", "Name a fruit.", "What is two plus two?", "Name a river.",
    "Name a tree.", "Say hello in French.", "Name a planet.", "What is ice?",
    "Name a bird.", "Name a metal.", "Name a shape.", "Say goodbye.",
]  # fmt: skip


async def test_a_healthy_twelve_turn_local_chat_raises_no_warning(
    local_backend: LocalBackend,
) -> None:
    turns = TurnController(local_backend, Settings(max_tokens=12, temperature=0))
    for question in QUESTIONS:
        async for _ in turns.send(question):
            pass
    metrics = [e.metrics for e in turns.exchanges]
    assert all(m is not None for m in metrics)
    assert [m.warnings for m in metrics if m is not None] == [()] * 12
    # the turns after the first reuse the cache, and say so consistently
    later = [m for m in metrics[1:] if m is not None]
    assert all((m.cached_tokens or 0) > 0 and m.server_cache_n == m.cached_tokens for m in later)


async def test_a_long_local_prefill_reports_progress_batch_by_batch() -> None:
    backend = LocalBackend(LocalConfig(model_path=default_model_path(), n_ctx=1024, n_batch=64))
    await backend.start()
    try:
        turns = TurnController(backend, Settings(max_tokens=2, temperature=0))
        events = [e async for e in turns.send("Count: " + "one two three four " * 40)]
        # the next turn finds the first in the cache: its progress counts from there
        again = [e async for e in turns.send("And: " + "five six seven eight " * 30)]
    finally:
        await backend.aclose()
    for stream in (events, again):
        (prompt,) = [e for e in stream if isinstance(e, PromptEvaluated)]
        progress = [e for e in stream if isinstance(e, PrefillProgress)]
        batches = -(-prompt.evaluated_tokens // 64)
        assert len(progress) == batches >= 3
        # tokens done, the cached prefix included (llama-server's shape): batch i has
        # read min(64 (i + 1), evaluated) after the cached ones
        assert [p.processed for p in progress] == [
            prompt.cached_tokens + min(64 * (i + 1), prompt.evaluated_tokens)
            for i in range(batches)
        ]
        assert progress[-1].processed == progress[-1].total == prompt.prompt_tokens
        assert all(p.cached == prompt.cached_tokens for p in progress)
        assert progress[0].time_ms < progress[-1].time_ms
        # every progress event comes before the first token
        first_text = next(i for i, e in enumerate(stream) if isinstance(e, TextDelta))
        assert max(stream.index(p) for p in progress) < first_text
    (second,) = [e for e in again if isinstance(e, PromptEvaluated)]
    assert second.cached_tokens > 150  # the whole first turn, at least its question


def test_an_answer_cut_inside_a_character_drops_its_bytes(local_backend: LocalBackend) -> None:
    text = "日本語のテキスト"
    tokens = local_backend._llm.tokenize(text.encode(), add_bos=False, special=False)
    decode = local_backend.token_decoder()
    # find a token that ends inside a character: its piece decodes to nothing yet
    outs = [decode(t) for t in tokens]
    cut = next(i for i, out in enumerate(outs) if out == "")
    decode = local_backend.token_decoder()
    shown = "".join(decode(t) for t in tokens[: cut + 1]) + decode(None)
    assert "\ufffd" not in shown and text.startswith(shown) and len(shown) < len(text)
