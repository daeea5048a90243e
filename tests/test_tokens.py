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


def test_pieces_count_each_token_once_where_it_starts() -> None:
    # cl100k: "hello world" is "hello" + " world"; counted piece by piece, "lo world"
    # alone would be 2 tokens ("lo", " world"), the whole text's cut gives 1 and 1
    assert tokens.estimate_text("hel") + tokens.estimate_text("lo world") == 3
    assert tokens.estimate_pieces("hello world", [3, 8]) == [1, 1]
    # a piece past the text counts 0; an empty piece of a text 0 as well
    assert tokens.estimate_pieces("hello world", [3, 8, 4]) == [1, 1, 0]
    # 語 is two tokens (its UTF-8 bytes split 2 + 1): both start in its piece; テキスト is 3
    assert tokens.estimate_pieces("日本語のテキスト", [1, 1, 1, 1, 4]) == [1, 1, 2, 1, 3]
    # every token is counted exactly once, whatever the cut
    text = "The quick brown fox jumps over the lazy dog. " * 40
    cut = [7] * (len(text) // 7) + [len(text) % 7]
    counted = tokens.estimate_pieces(text, cut)
    assert len(counted) == len(cut)
    starts = tokens.estimate_text(text)
    # a piece in the middle of a token still counts 1 (the chunk carried something)
    assert starts <= sum(counted) <= starts + sum(1 for c in counted if c == 1)
