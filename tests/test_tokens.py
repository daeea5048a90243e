"""Token estimates for remote backends (backends/tokens.py): a chat's history is counted
once however many requests repeat it, and the figure is the same as counting afresh."""

from __future__ import annotations

from phasechat.backends import tokens
from phasechat.backends.events import Message


def test_a_repeated_history_is_counted_once_and_the_same() -> None:
    history = [
        Message("user" if i % 2 == 0 else "assistant", f"turn {i} " * 500) for i in range(20)
    ]
    fresh = 3 + sum(3 + tokens.estimate_text(m.content) for m in history)
    tokens.estimate_once.cache_clear()
    assert tokens.estimate_messages(history) == fresh
    before = tokens.estimate_once.cache_info()
    for draft in ("a", "ab", "abc"):
        with_draft = [*history, Message("user", draft)]
        assert tokens.estimate_messages(with_draft) == fresh + 3 + tokens.estimate_text(draft)
    after = tokens.estimate_once.cache_info()
    assert after.misses - before.misses == 1  # only the last turn of the first request
    assert after.hits - before.hits == 3 * 20 - 1
    assert tokens.estimate_messages([]) == 3
