"""Prompt anatomy by hand: sections from token pieces (a BOS, a character split across
two tokens, the template between the parts), the cached prefix laid over them, estimates
that still add up, and where a cache break is found."""

from __future__ import annotations

import pytest

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import AnswerTokens, Message
from phasechat.chat.engine_held import (
    Held,
    anatomy_of,
    held_after,
    ms_per_evaluated_token,
    parts_of,
    section_at,
)
from phasechat.chat.trim.summarize import SUMMARY_HEADER
from phasechat.telemetry.anatomy import (
    Anatomy,
    CacheBreak,
    HeldTokens,
    Part,
    Section,
    anatomy_from_dict,
    common_prefix,
    find_break,
    locate,
    reusable,
    split_estimated,
    split_exact,
)
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.read_back import Unreadable, anatomy_read_back

TEXT = "<s>sys: Be brief.</s><u>héllo</u><a>"
#: The tokens of TEXT as an engine cuts them: a BOS with no text, "é" split in two.
PIECES = (
    b"\xff\xfe",  # a BOS the text does not show
    b"<s>sys: ",
    b"Be",
    b" brief.",
    b"</s><u>",
    b"h",
    "é".encode()[:1],
    "é".encode()[1:] + b"llo",
    b"</u><a>",
)
PARTS = [Part("system", 0, "Be brief."), Part("new", 1, "héllo")]


def test_tokens_go_to_the_section_their_first_byte_is_in() -> None:
    a = split_exact(TEXT, (b"", *PIECES[1:]), PARTS, None, None, "tokenizer")
    assert a is not None
    got = [(s.kind, s.message_index, s.tokens) for s in a.sections]
    assert got == [("system", 0, 2), ("new", 1, 3), ("template", None, 4)]
    assert a.prompt_tokens == len(PIECES)  # every token, once
    assert [s.cached_tokens for s in a.sections] == [None, None, None]  # nothing reported


def test_a_bos_the_text_does_not_show_is_the_templates() -> None:
    a = split_exact(TEXT, PIECES, PARTS, cached=3, ms_per_token=2.0, source="tokenizer")
    assert a is not None
    by_kind = {s.kind: s for s in a.sections}
    assert by_kind["template"].tokens == 4 and by_kind["system"].tokens == 2
    # the first 3 tokens were cached: the BOS, "<s>sys: " (template) and "Be" (system)
    assert (by_kind["template"].cached_tokens, by_kind["system"].cached_tokens) == (2, 1)
    assert by_kind["new"].cached_tokens == 0
    assert by_kind["system"].evaluated_tokens == 1 and by_kind["system"].prefill_ms == 2.0
    assert by_kind["template"].prefill_ms == 4.0  # 2 read x 2 ms
    assert a.cached_chars == len("<s>sys: Be")  # where the cached prefix ends in the text
    assert [(TEXT[s:e], n) for s, e, n in a.spans] == [("Be brief.", 0), ("héllo", 1)]


def test_pieces_that_are_not_the_text_give_no_exact_split() -> None:
    assert split_exact(TEXT, (b"other",), PARTS, None, None, "tokenizer") is None
    assert split_exact(TEXT, PIECES, [Part("new", 1, "absent")], None, None, "x") is None


def test_estimated_sections_add_up_to_the_servers_count() -> None:
    parts = [Part("system", 0, "a b c d"), Part("history", 1, "x"), Part("new", 2, "y z")]
    words = lambda text: len(text.split())  # noqa: E731
    a = split_estimated(parts, prompt_tokens=20, cached=9, ms_per_token=1.0, count=words)
    assert [s.tokens for s in a.sections] == [4, 1, 2, 13]
    assert a.prompt_tokens == 20 and a.source == "estimate"
    assert sum(s.cached_tokens or 0 for s in a.sections) == 9
    assert sum(s.evaluated_tokens or 0 for s in a.sections) == 11
    # an estimate over the real count is cut down: the sum stays the engine's
    assert split_estimated(parts, 5, None, None, words).prompt_tokens == 5
    hidden = split_estimated(parts, 20, None, None, words)
    assert {s.cached_tokens for s in hidden.sections} == {None}  # never a guess as fact


def test_the_system_prompt_and_the_summary_are_two_sections() -> None:
    summary = f"Be brief.\n\n{SUMMARY_HEADER}they talked about boats"
    parts = parts_of([Message("system", summary), Message("user", "q")])
    assert [(p.kind, p.text) for p in parts] == [
        ("system", "Be brief."),
        ("summary", SUMMARY_HEADER + "they talked about boats"),
        ("new", "q"),
    ]


def test_a_break_names_the_message_and_the_changed_words() -> None:
    held = "<s>Answer briefly please</s><u>q1</u>"
    sent = "<s>Answer concisely please</s><u>q1</u>"
    spans = [(3, 24, 0), (31, 33, 1)]
    a = split_estimated([Part("system", 0, "x"), Part("new", 1, "y")], 10, 0, None, len)
    brk = find_break(held, sent, spans, a.sections, tokens_read_again=30, estimated=False)
    assert brk is not None
    assert (brk.message_index, brk.char_offset) == (0, len("Answer "))
    assert "briefly" in brk.held and "concisely" in brk.sent
    assert brk.tokens_read_again == 30
    assert "cache broke in message 0 at character 7" in brk.line()
    # the end of the last answer re-read (a few tokens, the same text): no break
    assert find_break(held, held + "more", spans, a.sections, 2, False) is None
    # the text agrees, yet it read 50 again: with no tokens, the cause is not known
    other = find_break(held, held + "more", spans, a.sections, 50, False)
    assert other is not None and other.message_index is None and other.tokens_read_again == 50
    assert other.kind == "unexplained"


def test_anatomy_of_a_turn_and_the_break_after_an_edit() -> None:
    metrics = metrics_from_dict(
        {"prompt_tokens": 9, "cached_tokens": 3, "cache_reported": True, "ttft_ms": 12.0,
         "evaluated_prompt_tokens": 6}
    )  # fmt: skip
    rendered = RenderedPrompt(TEXT, PIECES, "tokenizer")
    messages = [Message("system", "Be brief."), Message("user", "héllo")]
    held = Held("<s>sys: Be quick.</s><u>héllo</u><a>Hi</a>", 12)
    a = anatomy_of(messages, rendered, metrics, held)
    assert a is not None and a.prompt_tokens == 9 and a.source == "tokenizer"
    assert [s.prefill_ms for s in a.sections] == [2.0, 6.0, 4.0]  # 12 ms / 6 read, each
    assert a.cache_break is not None and a.cache_break.message_index == 0
    assert a.cache_break.char_offset == len("Be ") and a.cache_break.tokens_read_again == 9
    assert section_at(rendered, messages, 2) == "system prompt"
    assert section_at(rendered, messages, 6) == "new message 1"
    assert section_at(rendered, messages, 1) == "template"


def test_a_part_at_the_very_start_owns_its_first_token_and_an_empty_token_is_the_templates() -> (
    None
):
    # no template before the part: "Be" starts at byte 0 and is the system prompt's; the
    # empty token inside the part (a control token that shows no text) is the template's
    pieces = (b"Be", b"", b" brief.", b"<a>")
    a = split_exact("Be brief.<a>", pieces, [Part("system", 0, "Be brief.")], 1, 2.0, "x")
    assert a is not None
    got = [(s.kind, s.tokens, s.cached_tokens, s.evaluated_tokens) for s in a.sections]
    assert got == [("system", 2, 1, 1), ("template", 2, 0, 2)]
    assert [s.prefill_ms for s in a.sections] == [2.0, 4.0]


@pytest.mark.parametrize(
    ("cached", "chars"),
    [(0, 0), (1, 0), (2, len("<s>sys: ")), (3, len("<s>sys: Be"))],
)
def test_the_cached_prefix_in_the_text_starts_after_the_bos(cached: int, chars: int) -> None:
    # PIECES[0] is a 2-byte BOS, PIECES[1] 8 bytes: a cache of 0 or 1 token holds no text
    # (nor a negative amount of it); 2 tokens hold the BOS and "<s>sys: "
    a = split_exact(TEXT, PIECES, PARTS, cached=cached, ms_per_token=None, source="x")
    assert a is not None and a.cached_chars == chars


@pytest.mark.parametrize(
    ("prompt_tokens", "tokens"),
    [
        (8, [4, 1, 2, 1]),  # one left for the template
        (7, [4, 1, 2, 0]),  # the estimate is exact
        (6, [3, 1, 2, 0]),  # one over: the largest part loses one
        (5, [2, 1, 2, 0]),
        (2, [0, 1, 1, 0]),  # five over: the largest is emptied, then the next largest cut
    ],
)
def test_an_estimate_over_the_engines_count_is_cut_from_the_largest_part_down_to_it(
    prompt_tokens: int, tokens: list[int]
) -> None:
    parts = [Part("system", 0, "a b c d"), Part("history", 1, "x"), Part("new", 2, "y z")]
    a = split_estimated(parts, prompt_tokens, None, None, lambda text: len(text.split()))
    assert [s.tokens for s in a.sections] == tokens


def test_an_estimate_spreads_the_template_before_each_part_the_last_taking_the_rest() -> None:
    # 7 template tokens over 3 parts: 2 before the system prompt, 2 before the history,
    # the remaining 3 before the new message, which ends the prompt:
    # T T s s s s T T h T T T n n, the first 13 cached
    parts = [Part("system", 0, "a b c d"), Part("history", 1, "x"), Part("new", 2, "y z")]
    a = split_estimated(parts, 14, 13, 1.0, lambda text: len(text.split()))
    got = [(s.kind, s.tokens, s.cached_tokens, s.evaluated_tokens) for s in a.sections]
    assert got == [
        ("system", 4, 4, 0),
        ("history", 1, 1, 0),
        ("new", 2, 1, 1),
        ("template", 7, 7, 0),
    ]
    assert [s.prefill_ms for s in a.sections] == [0.0, 0.0, 1.0, 0.0]
    # the first 9 cached: the history's token is the 9th, the new message's template after it
    nine = split_estimated(parts, 14, 9, None, lambda text: len(text.split()))
    assert [s.cached_tokens for s in nine.sections] == [4, 1, 0, 4]


def test_the_engine_holds_the_prompt_then_the_answer_and_their_tokens_summed() -> None:
    m = metrics_from_dict({"prompt_tokens": 9, "output_tokens": 3})
    exact = split_exact(TEXT, PIECES, PARTS, None, None, "tokenizer")
    assert held_after(exact, "Hi", m) == Held(TEXT + "Hi", 12, "tokenizer", None, False, len(TEXT))
    # token by token where the engine said: the prompt's pieces, then the answer's
    hi = AnswerTokens((7, 8), (b"H", b"i"), "v")
    held = held_after(exact, "Hi", m, RenderedPrompt(TEXT, PIECES, "tokenizer"), hi)
    assert held is not None and held.pieces == (*PIECES, b"H", b"i") and held.answer_known
    estimate = split_estimated(PARTS, 9, None, None, len)
    assert held_after(estimate, "Hi", m) is None  # no text: nothing to compare with


@pytest.mark.parametrize(
    ("fields", "ms"),
    [
        ({"server_prompt_ms": 30.0, "server_prompt_n": 6, "ttft_ms": 99.0}, 5.0),
        ({"server_prompt_ms": 30.0, "ttft_ms": 12.0, "evaluated_prompt_tokens": 4}, 3.0),
        ({"server_prompt_n": 6, "ttft_ms": 12.0, "evaluated_prompt_tokens": 4}, 3.0),
        ({"evaluated_prompt_tokens": 4}, None),
    ],
)
def test_an_evaluated_token_costs_the_engines_own_ms_per_token_else_ttft_per_token(
    fields: dict[str, float], ms: float | None
) -> None:
    assert ms_per_evaluated_token(metrics_from_dict(fields)) == ms


# The engine held a prompt "Q?A:" and its answer "KVC rocks" as it sampled it: "K" +
# "VC"; the next prompt has the same text, tokenized again: "KV" + "C".
HELD = "Q?A:KVC rocks"
HELD_PIECES = (b"Q?", b"A:", b"K", b"VC", b" rocks")
SENT = HELD + "|U:more"
SENT_PIECES = (b"Q?", b"A:", b"KV", b"C", b" rocks", b"|U:", b"more")
SPANS = [(4, 13, 0), (16, 20, 1)]


def _sections() -> list[Section]:
    parts = [Part("history", 2, "KVC rocks"), Part("new", 3, "more")]
    return list(split_estimated(parts, 7, 0, None, len).sections)


def test_the_same_text_split_otherwise_is_named_a_retokenization() -> None:
    tokens = HeldTokens(HELD_PIECES, SENT_PIECES, True, len("Q?A:"), 2)
    brk = find_break(HELD, SENT, SPANS, _sections(), 5, False, tokens=tokens)
    assert brk is not None and brk.kind == "retokenized" and brk.in_answer
    # the engine's split, then this prompt's, until both meet on a boundary again
    assert (brk.held, brk.sent) == ("K|VC", "KV|C")
    assert (brk.message_index, brk.char_offset) == (2, 0)  # where "K" starts
    assert brk.line() == (
        "the previous answer was tokenized differently at ‹K|VC› (now ‹KV|C›), 5 tokens read again"
    )
    # by text alone the two agree: it read some again, for a reason text cannot tell
    other = find_break(HELD, SENT, SPANS, _sections(), 5, False)
    assert other is not None and other.kind == "unexplained" and other.message_index is None


def test_a_token_split_over_changed_text_is_an_edit_found_by_its_text() -> None:
    sent = "Q?A:KVX rocks|U:more"
    pieces = (b"Q?", b"A:", b"KV", b"X", b" rocks", b"|U:", b"more")
    tokens = HeldTokens(HELD_PIECES, pieces, True, len("Q?A:"), 2)
    brk = find_break(HELD, sent, SPANS, _sections(), 5, False, tokens=tokens)
    assert brk is not None and brk.kind == "edit"
    assert (brk.message_index, brk.char_offset) == (2, 2)  # "C" -> "X", not where "K" is
    assert brk.line().startswith("cache broke in message 2 at character 2: ")


def test_a_server_whose_answer_tokens_are_unknown_is_placed_by_its_cached_count() -> None:
    # the held prompt's tokens agree whole; the server reused 3 (up to "KV"), the
    # answer's text is the start of the next prompt: it read the answer's rest again
    tokens = HeldTokens(HELD_PIECES[:2], SENT_PIECES, False, len("Q?A:"), 3)
    brk = find_break(HELD, SENT, SPANS, _sections(), 5, False, tokens=tokens)
    assert brk is not None and brk.kind == "retokenized" and brk.in_answer
    assert (brk.held, brk.sent, brk.char_offset) == ("", "C| rocks", 2)
    assert brk.line() == (
        "the previous answer was tokenized differently at ‹C| rocks› "
        "(as sent now; its own tokens not seen: not confirmed), "
        "5 tokens read again"
    )
    # the answer's text changed (a thinking block dropped, say): not a re-tokenization
    changed = "Q?A:KVZ rocks|U:more"
    brk = find_break(HELD, changed, SPANS, _sections(), 5, False, tokens=tokens)
    assert brk is not None and brk.kind == "edit" and brk.char_offset == 2
    # a few tokens read again (the template's end-of-turn): no break at all
    assert find_break(HELD, SENT, SPANS, _sections(), 2, False, tokens=tokens) is None


def test_an_engine_caching_blocks_that_stopped_inside_the_held_prompt_read_its_answer_again() -> (
    None
):
    # blocks of 2: the held prompt (2 tokens, "Q?A:") ends on a block, the engine
    # reused 2 and read the answer again from "KV": placed at the answer's start
    tokens = HeldTokens(HELD_PIECES[:2], SENT_PIECES, False, len("Q?A:"), 2, grain=2)
    brk = find_break(HELD, SENT, SPANS, _sections(), 4, False, tokens=tokens, grain=2)
    assert brk is not None and brk.kind == "retokenized" and brk.in_answer
    assert (brk.sent, brk.char_offset) == ("KV|C", 0)
    # blocks of 4: the prompt's 2 tokens fill none, so the engine reused 0, and the
    # break is still the answer's (any prefix: 0 < 2 would say it held something else)
    tokens = HeldTokens(HELD_PIECES[:2], SENT_PIECES, False, len("Q?A:"), 0, grain=4)
    brk = find_break(HELD, SENT, SPANS, _sections(), 4, False, tokens=tokens, grain=4)
    assert brk is not None and brk.kind == "retokenized" and brk.sent == "KV|C"
    tokens = HeldTokens(HELD_PIECES[:2], SENT_PIECES, False, len("Q?A:"), 0)
    brk = find_break(HELD, SENT, SPANS, _sections(), 4, False, tokens=tokens)
    assert brk is not None and brk.kind == "other"


def test_anatomy_of_confirms_a_held_chat_by_the_engines_cached_count() -> None:
    """A new process reads what the engine held from the chat's last exchange; it is
    believed only when the engine reused about what the two share."""
    held_text = "<s>sys: Be brief.</s><u>hullo</u><a>"
    held_pieces = (*PIECES[1:5], b"hullo", b"</u><a>")
    held = Held(held_text + "Yo", 9, "tokenizer", held_pieces, False, len(held_text), True)
    rendered = RenderedPrompt(TEXT, PIECES[1:], "tokenizer")  # the server adds the BOS
    messages = [Message("system", "Be brief."), Message("user", "héllo")]

    def brk(cached: int, grain: int = 1) -> object:
        m = metrics_from_dict({"prompt_tokens": 9, "cached_tokens": cached, "cache_reported": True})
        a = anatomy_of(messages, rendered, m, held, grain)
        assert a is not None
        return a.cache_break

    # BOS + 4 tokens shared: a cached count of 5 (or a few less) confirms it
    confirmed = brk(5)
    assert isinstance(confirmed, CacheBreak) and confirmed.message_index == 1
    assert confirmed.char_offset == 1 and confirmed.tokens_read_again == 4  # "u" -> "é"
    assert brk(0) is None  # the engine held nothing of it (restarted)
    assert brk(7) is None  # more than the two share: it held something else
    # an engine caching blocks of 4 reuses the shared 5's whole block: 4 confirms it;
    # 0 does not (nothing reused; the slack of a prefix cache would have allowed 1)
    assert isinstance(brk(4, 4), CacheBreak)
    assert brk(0, 4) is None
    assert brk(7, 4) is None


@pytest.mark.parametrize(("read_again", "found"), [(3, False), (4, True), (5, True)])
def test_a_break_of_exactly_the_minimum_tokens_is_a_break(read_again: int, found: bool) -> None:
    held = "<s>Answer briefly please</s><u>q1</u>"
    sent = "<s>Answer concisely please</s><u>q1</u>"
    spans = [(3, 24, 0), (31, 33, 1)]
    a = split_estimated([Part("system", 0, "x"), Part("new", 1, "y")], 10, 0, None, len)
    brk = find_break(held, sent, spans, a.sections, read_again, estimated=True)
    if not found:
        assert brk is None
        return
    # "Answer " is shared: the texts part at character 10 of the prompt, 7 of message 0;
    # shown from 12 characters before it (3, clamped at 0) to 24 after
    assert brk == CacheBreak(
        message_index=0,
        char_offset=7,
        held=held[0:34],
        sent=sent[0:34],
        tokens_read_again=read_again,
        estimated=True,
        kind="edit",
        in_answer=False,
    )
    assert brk.line() == (
        f"cache broke in message 0 at character 7: `{held[:34]}` -> `{sent[:34]}`; "
        f"{read_again} tokens read again (estimated)"
    )


def test_a_short_cached_prefix_of_an_estimate_falls_on_the_template_before_the_first_part() -> None:
    # T T s s s s T T h T T T n n: the first 3 cached are two of the template's and the
    # first of the system prompt's (the template not spread would give the system all 3)
    parts = [Part("system", 0, "a b c d"), Part("history", 1, "x"), Part("new", 2, "y z")]
    a = split_estimated(parts, 14, 3, 2.0, lambda text: len(text.split()))
    got = [
        (s.kind, s.tokens, s.cached_tokens, s.evaluated_tokens, s.prefill_ms) for s in a.sections
    ]
    assert got == [
        ("system", 4, 1, 3, 6.0),
        ("history", 1, 0, 1, 2.0),
        ("new", 2, 0, 2, 4.0),
        ("template", 7, 2, 5, 10.0),
    ]


def test_a_break_far_into_the_prompt_shows_twelve_characters_before_it_and_24_after() -> None:
    held = "<s>" + "a" * 40 + "</s><u>q1 and the rest of the first question</u>"
    sent = "<s>" + "a" * 40 + "</s><u>q2 and the rest of the first question</u>"
    spans = [(3, 43, 0), (50, 89, 1)]
    a = split_estimated([Part("system", 0, "x"), Part("new", 1, "y")], 10, 0, None, len)
    brk = find_break(held, sent, spans, a.sections, 30, estimated=False)
    at = 51  # "q" is shared, "1" / "2" differ
    assert brk == CacheBreak(1, 1, held[at - 12 : at + 24], sent[at - 12 : at + 24], 30, False)


def test_a_break_right_after_a_message_is_placed_at_the_start_of_the_next() -> None:
    # the template's text after message 0 changed: the break is at the end of its span,
    # which belongs to message 1 (at its offset 0), not to message 0 at its end
    held = "<s>aaa</s><u>qq</u>"
    sent = "<s>aaa[/s]<u>qq</u>"
    spans = [(3, 6, 0), (13, 15, 1)]  # in the sent text
    a = split_estimated([Part("system", 0, "x"), Part("new", 1, "y")], 10, 0, None, len)
    brk = find_break(held, sent, spans, a.sections, 10, estimated=False)
    assert brk is not None and (brk.message_index, brk.char_offset) == (1, 0)
    # a break inside message 0's text is placed there
    inside = find_break("<s>abc</s>", "<s>abX</s>", [(3, 6, 0)], a.sections, 10, False)
    assert inside is not None and (inside.message_index, inside.char_offset) == (0, 2)


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ("", "", 0),
        ("abc", "", 0),
        ("abc", "abd", 2),
        ("abc", "abc", 3),
        ("abc", "abcdef", 3),
        ("xbc", "abc", 0),
        ("a" * 1000 + "b", "a" * 1000 + "c", 1000),
        ("a" * 999, "a" * 1000, 999),
    ],
)
def test_the_common_prefix_is_the_longest_shared_start(a: str, b: str, n: int) -> None:
    assert common_prefix(a, b) == n == common_prefix(b, a)


def test_parts_are_found_in_order_and_by_their_stripped_text_when_the_template_trims() -> None:
    text = "<s> Be brief.</s><u>hi</u><u>hi</u>"
    parts = [Part("system", 0, " Be brief.\n"), Part("new", 1, "hi"), Part("new", 2, "hi")]
    # the template dropped the system prompt's newline: found stripped; the second "hi"
    # after the first
    assert locate(text, parts) == [(4, 13), (20, 22), (29, 31)]
    assert locate(text, [Part("new", 1, "absent")]) is None
    assert locate(text, [Part("new", 1, "")]) == [(0, 0)]


def test_token_runs_are_shown_until_both_sides_meet_on_a_boundary() -> None:
    # held "ab|c|de", sent "a|bc|d|e": they part at the first token and meet again after
    # "abc" (held: ab|c, sent: a|bc)
    held = (b"ab", b"c", b"de")
    sent = (b"a", b"bc", b"d", b"e", b"!")
    tokens = HeldTokens(held, sent, True, 0, None)
    brk = find_break("abcde", "abcde!", [(0, 6, 0)], _sections(), 5, False, tokens=tokens)
    assert brk is not None and brk.kind == "retokenized"
    assert (brk.held, brk.sent, brk.char_offset) == ("ab|c", "a|bc", 0)


def test_a_prompt_the_same_as_what_was_held_yet_read_again_means_something_else_was_held() -> None:
    held = "<s>same</s>"
    pieces = (b"<s>", b"same", b"</s>")
    tokens = HeldTokens(pieces, pieces, True, len(held), 0)
    brk = find_break(held, held, [(3, 7, 0)], _sections(), 11, False, tokens=tokens)
    assert brk == CacheBreak(None, 0, "", "", 11, False, "other")
    # by text alone (an estimate) the same agreement says only that it read some again
    brk = find_break(held, held, [(3, 7, 0)], _sections(), 11, True)
    assert brk == CacheBreak(None, 0, "", "", 11, True, "unexplained")
    assert brk.line() == (
        "cache: 11 tokens of what the engine held read again; "
        "the cause is not known without the server's tokens"
    )
    assert find_break(held, held, [(3, 7, 0)], _sections(), None, False) is None  # not said
    assert find_break(held + "more", held, [(3, 7, 0)], _sections(), 11, False) is None


def test_an_anatomy_read_back_and_each_kind_of_break_in_words() -> None:
    a = split_estimated([Part("system", 0, "a b"), Part("new", 1, "c")], 5, 2, 1.5, len)
    brk = CacheBreak(3, 7, "old", "new", 12, True)
    back = anatomy_from_dict(Anatomy(a.sections, "estimate", brk).as_dict())
    assert back == Anatomy(a.sections, "estimate", brk)
    assert anatomy_from_dict({"prompt_sections": [{"kind": "x"}]}) is None
    assert anatomy_from_dict({}) is None
    assert CacheBreak(None, 0, "", "", 1234, False, "other").line() == (
        "cache broke: the engine held something else since; 1,234 tokens read again"
    )
    assert CacheBreak(None, 0, "", "", None, False, "other").line() == (
        "cache broke: the engine held something else since"
    )
    assert (
        CacheBreak(None, 5, "a", "b", None, False).line()
        == "cache broke before the first message: `a` -> `b`"
    )
    assert CacheBreak(2, 0, "", "K|V", 3, False, "retokenized").line() == (
        "message 2 was tokenized differently at ‹K|V› "
        "(as sent now; its own tokens not seen: not confirmed), 3 tokens read again"
    )
    assert CacheBreak(None, 0, "A|B", "AB", None, False, "retokenized").line() == (
        "the prompt was tokenized differently at ‹A|B› (now ‹AB›)"
    )


def _second_turn(cached: int, grain: int) -> CacheBreak | None:
    """A plain second turn, estimated: the engine held the first prompt and its answer
    (28 + 24 = 52 tokens), whose text is the start of this 69-token prompt's."""
    messages = [Message("system", "Be brief."), Message("user", "q1")]
    m1 = metrics_from_dict({"prompt_tokens": 28, "cached_tokens": 0, "cache_reported": True})
    first = anatomy_of(messages, None, m1, None)
    m1 = metrics_from_dict({"prompt_tokens": 28, "output_tokens": 24})
    held = held_after(first, "An answer.", m1)
    assert held is not None and held.tokens == 52
    messages += [Message("assistant", "An answer."), Message("user", "q2")]
    m2 = metrics_from_dict({"prompt_tokens": 69, "cached_tokens": cached, "cache_reported": True})
    a = anatomy_of(messages, None, m2, held, grain)
    assert a is not None and a.source == "estimate"
    return a.cache_break


def test_an_engine_caching_whole_blocks_reuses_only_the_held_tokens_whole_blocks() -> None:
    # held 52, blocks of 16: 48 reusable (the 52nd, the last sampled token, is never
    # written, and the 49th-51st fill no block)
    assert reusable(52, 16) == 48
    assert reusable(64, 16) == 48  # 63 written: three whole blocks, not four
    assert reusable(65, 16) == 64
    assert reusable(52, 1) == 52  # any prefix: all of it (its re-read end: BREAK_MIN_TOKENS)
    assert reusable(0, 16) == 0
    assert _second_turn(48, 16) is None  # all it could reuse: a plain next turn
    # 32 cached: 16 read again beyond the grain (without it: 20, and a break either way)
    brk = _second_turn(32, 16)
    assert brk is not None and brk.tokens_read_again == 16 and brk.grain == 16
    assert brk.kind == "unexplained"  # an estimate: no tokens to say why
    assert brk.line() == (
        "cache: 16 tokens of what the engine held read again (beyond whole blocks of 16); "
        "the cause is not known without the server's tokens"
    )
    # the same counts on an engine that reuses any prefix: 48 cached is 4 held tokens
    # read again (BREAK_MIN_TOKENS: a break), 49 is 3 (the template's re-read end)
    brk = _second_turn(48, 1)
    assert brk is not None and brk.tokens_read_again == 4
    assert _second_turn(49, 1) is None
    brk = _second_turn(32, 1)
    assert brk is not None and brk.tokens_read_again == 20 and brk.grain == 1
    assert "blocks" not in brk.line()


def test_a_break_read_back_keeps_its_block_size_and_an_old_one_has_none() -> None:
    brk = CacheBreak(2, 0, "", "K|V", 32, False, "retokenized", True, 32)
    a = split_estimated([Part("system", 0, "a b"), Part("new", 1, "c")], 5, 2, 1.5, len)
    data = Anatomy(a.sections, "server", brk).as_dict()
    assert anatomy_read_back(data).cache_break == brk
    del data["cache_break"]["grain"]  # a chat saved before breaks kept it
    back = anatomy_read_back(data).cache_break
    assert back is not None and back.grain == 1
    data["cache_break"]["grain"] = 0
    with pytest.raises(Unreadable):
        anatomy_read_back(data)
    assert brk.line() == (
        "the previous answer was tokenized differently at ‹K|V› "
        "(as sent now; its own tokens not seen: not confirmed), "
        "32 tokens read again (beyond whole blocks of 32)"
    )


def test_a_reopened_chat_on_an_engine_caching_blocks_is_confirmed_by_its_whole_blocks() -> None:
    """Issue 49: a chat reopened on vLLM (blocks of 16): the held prompt and this one share
    64 tokens (a multiple of the block). The engine keeps the whole blocks of all but the
    last shared token (48), and a cached count of 48 confirms it held the chat: the
    break is shown. A prefix cache's slack (60 to 64) would not have allowed 48."""
    head = "<s>sys: Be brief.</s><u>"  # 24 one-byte tokens
    q_old, q_new = "a" * 40 + "OLD question", "a" * 40 + "new question"
    held_text, text = f"{head}{q_old}</u><a>", f"{head}{q_new}</u><a>"
    held_pieces = tuple(bytes([c]) for c in held_text.encode())
    tokens = len(held_pieces) + 1  # and the answer's one
    held = Held(held_text + "Yo", tokens, "tokenizer", held_pieces, False, len(held_text), True)
    pieces = tuple(bytes([c]) for c in text.encode())
    rendered = RenderedPrompt(text, pieces, "tokenizer")
    messages = [Message("system", "Be brief."), Message("user", q_new)]

    def brk(cached: int, grain: int) -> object:
        m = metrics_from_dict(
            {"prompt_tokens": len(pieces), "cached_tokens": cached, "cache_reported": True}
        )
        a = anatomy_of(messages, rendered, m, held, grain)
        assert a is not None
        return a.cache_break

    confirmed = brk(48, 16)
    assert isinstance(confirmed, CacheBreak) and confirmed.message_index == 1
    assert brk(65, 16) is None  # more than the two share: it held something else
    assert brk(32, 16) is None  # a block short: it held something else
    assert brk(48, 1) is None  # without blocks, 48 of 64 shared is another prompt
    assert isinstance(brk(62, 1), CacheBreak)
