"""Stop strings split across tokens are never shown."""

from __future__ import annotations

from phasechat.backends.local.stops import StopMatcher


def run(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_stop_split_across_pieces() -> None:
    assert run(["Hello <|im", "_end|> more"], ["<|im_end|>"]) == ("Hello ", True)


def test_partial_match_released_when_it_is_not_a_stop() -> None:
    assert run(["a <|i", "s not"], ["<|im_end|>"]) == ("a <|is not", False)


def test_held_text_flushed_at_end() -> None:
    assert run(["ends with <|im"], ["<|im_end|>"]) == ("ends with <|im", False)


def test_no_stops_passes_through() -> None:
    assert run(["a", "b"], []) == ("ab", False)


def test_earliest_of_several_stops() -> None:
    assert run(["x STOP y END"], ["END", "STOP"]) == ("x ", True)
