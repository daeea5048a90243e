"""SSE parsing: events split anywhere, comments, line ends, the end of the stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.remote.sse import SSEEvent, SSEParser


def parse_in_pieces(data: bytes, size: int) -> list[SSEEvent]:
    parser = SSEParser()
    out: list[SSEEvent] = []
    for i in range(0, len(data), size):
        out += parser.feed(data[i : i + size])
    return out + parser.close()


def test_basic_events_and_done() -> None:
    events = parse_in_pieces(b'data: {"a":1}\n\ndata: [DONE]\n\n', 1000)
    assert [e.data for e in events] == ['{"a":1}', "[DONE]"]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_split_at_every_boundary_gives_the_same_events(fixtures_dir: Path, size: int) -> None:
    for path in sorted(fixtures_dir.glob("*.sse")):
        data = path.read_bytes()
        whole = parse_in_pieces(data, len(data))
        assert parse_in_pieces(data, size) == whole, path.name
        assert whole[-1].data == "[DONE]"


def test_multibyte_character_split_between_reads() -> None:
    data = "data: こんにちは\n\n".encode()
    events = parse_in_pieces(data, 1)
    assert events == [SSEEvent("こんにちは")]


def test_keepalive_comments_are_skipped_and_counted() -> None:
    parser = SSEParser()
    events = parser.feed(b": ping\n\n: keep-alive\ndata: x\n\n")
    assert [e.data for e in events] == ["x"]
    assert parser.comments == 2


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_all_line_endings(newline: bytes) -> None:
    data = b"event: delta" + newline + b"data: one" + newline + b"data: two" + newline + newline
    for size in (1, 2, len(data)):
        assert parse_in_pieces(data, size) == [SSEEvent("one\ntwo", "delta")]


def test_crlf_split_between_reads_is_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r\n") == [SSEEvent("a")]


def test_last_event_without_blank_line_is_kept_at_close() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"last":true}') == []
    assert parser.close() == [SSEEvent('{"last":true}')]


def test_data_without_space_and_id_field() -> None:
    assert parse_in_pieces(b"id: 7\ndata:x\n\n", 3) == [SSEEvent("x", "message", "7")]


def test_oversized_line_is_refused() -> None:
    parser = SSEParser(max_event_bytes=1024)
    with pytest.raises(ValueError, match="longer than"):
        parser.feed(b"data: " + b"x" * 2048)
