"""The recorder's own fields (telemetry/recorder.py), set event by event from a hand-made
stream, and the decode window they give (telemetry/metrics.py): each stream is built so
that a neighbouring choice (the stream's end for the last token, the arrival time for
the time a token was made) moves a figure well past rounding."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

import pytest

from phasechat.backends.events import (
    AnswerTokens,
    Event,
    Finished,
    KVStats,
    ModelLoaded,
    ModelLoading,
    Notice,
    PrefillProgress,
    PromptEvaluated,
    ReasoningDelta,
    ResponseStarted,
    ServerAccount,
    ServerTimings,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record

MS = 1_000_000


def server_answer(silent_ms: int | None, ended_ms: int | None = None) -> Trace:
    """A server's answer: 15 text chunks 10 ms apart from 200 ms (200..340), usage
    counting 16 tokens (one, the end-of-sequence token, sent without text), the finish
    chunk without text at `silent_ms` (None: none came), the stream's end as the
    backend stamped it at `ended_ms` (None: not stamped) and the event at 901 ms."""
    t = Trace("remote", "m")
    for i in range(15):
        t.observe(TextDelta("ab"), (200 + 10 * i) * MS)
    t.observe(Usage(30, 16), 900 * MS)
    silent = silent_ms * MS if silent_ms is not None else None
    ended = ended_ms * MS if ended_ms is not None else None
    t.observe(Finished("stop", silent, ended), 901 * MS)
    return t


@pytest.mark.parametrize("ended_ms", [None, 400])
def test_without_a_silent_chunk_the_window_ends_at_the_last_text_not_the_streams_end(
    ended_ms: int | None,
) -> None:
    t = server_answer(None, ended_ms)
    done = (ended_ms or 901) * MS  # the stream's end: the backend's stamp, else arrival
    assert (t.t_first_token, t.t_last_token) == (200 * MS, 340 * MS)
    assert (t.t_silent_token, t.t_done, t.finish) == (None, done, "stop")
    m = compute(t)
    assert m.output_tokens == 16
    # 15 gaps counted over the 140 ms to the last text: 107.1 tok/s; to the stream's end
    # (200 or 701 ms) it would be 75 or 21.4
    assert m.decode_tok_s == pytest.approx(15 / 0.140)
    assert m.tpot_ms == pytest.approx(140 / 15)
    assert m.e2e_ms == done / MS


def test_a_silent_chunk_after_the_last_text_ends_the_window_there() -> None:
    t = server_answer(350)
    assert (t.t_last_token, t.t_silent_token, t.t_done) == (340 * MS, 350 * MS, 901 * MS)
    assert compute(t).decode_tok_s == pytest.approx(15 / 0.150)


def test_every_field_of_a_thinking_answer_as_it_arrives() -> None:
    t = Trace("local", "m")
    t.t_sent = 10 * MS
    t.observe(ModelLoading(), 11 * MS)
    t.observe(ModelLoaded(t_ns=40 * MS), 45 * MS)  # the load ended before it was told
    t.observe(ResponseStarted(200, connect_ms=2.5), 50 * MS)
    t.observe(PromptEvaluated(20, 5, 15), 60 * MS)
    t.observe(ReasoningDelta("hm", 1), 100 * MS)
    t.observe(ReasoningDelta("m.", 2, t_ns=115 * MS), 130 * MS)  # made before it arrived
    t.observe(TextDelta("Hi", 1), 150 * MS)
    t.observe(TextDelta("", 0), 160 * MS)  # no token: the window moves, no time is kept
    t.observe(TextDelta(" there", 1), 170 * MS)
    t.observe(Notice("the server's count was not believed", doubt=True), 171 * MS)
    t.observe(Notice("a plain notice"), 172 * MS)
    t.observe(Finished("stop", None, 180 * MS), 200 * MS)
    assert (t.t_loading, t.t_loaded, t.t_first_byte, t.connect_ms) == (
        11 * MS,
        40 * MS,
        50 * MS,
        2.5,
    )
    assert (t.t_first_token, t.t_second_token, t.t_last_token) == (100 * MS, 115 * MS, 170 * MS)
    assert (t.t_first_reasoning, t.t_last_reasoning, t.t_first_answer) == (
        100 * MS,
        115 * MS,
        150 * MS,
    )
    assert (t.t_done, t.finish, t.done) == (180 * MS, "stop", True)
    # times from the send; the zero-token event has none
    assert list(t.times) == [90 * MS, 105 * MS, 140 * MS, 160 * MS]
    assert list(t.sizes) == [1, 2, 1, 1]
    assert list(t.lengths) == [2, 2, 2, 6]
    assert list(t.kinds) == [1, 1, 0, 0]
    assert (t.deltas, t.tokens, t.tokens_known) == (5, 5, True)
    assert (t.reasoning_deltas, t.reasoning_tokens, t.reasoning_tokens_known) == (2, 3, True)
    assert (t.chars, t.chars_first, t.text, t.reasoning) == (8, 2, "Hi there", "hmm.")
    assert t.notices == ["the server's count was not believed", "a plain notice"]
    assert t.doubts == ["the server's count was not believed"]


def test_a_chunk_without_a_count_makes_the_count_unknown_and_an_error_ends_it_at_arrival() -> None:
    t = Trace("remote", "m")
    t.observe(TextDelta("a", 1), 100 * MS)
    t.observe(TextDelta("b"), 110 * MS)  # a remote chunk: tokens not known
    t.observe(ReasoningDelta("c"), 120 * MS)
    t.observe(StreamError("connection", "lost"), 130 * MS)
    assert (t.tokens, t.tokens_known, t.deltas) == (1, False, 3)
    assert (t.reasoning_tokens, t.reasoning_tokens_known) == (0, False)
    assert list(t.sizes) == [1, 0, 0]  # a chunk of unknown size is kept, as 0
    assert (t.t_done, t.finish) == (130 * MS, "error")
    assert t.error is not None and t.error.message == "lost"


async def test_recording_stamps_from_the_send_and_an_abandoned_stream_is_closed() -> None:
    closed: list[bool] = []

    async def stream() -> AsyncIterator[Event]:
        try:
            yield TextDelta("a", 1)
            yield TextDelta("b", 1)
            yield Finished("stop")
        finally:
            closed.append(True)

    t = Trace("local", "m")
    recording = record(stream(), t)
    assert isinstance(recording, AsyncGenerator)  # closable: an async generator
    async with aclosing(recording):
        async for event in recording:
            assert event == TextDelta("a", 1)
            break  # the consumer leaves after the first event
    assert t.t_sent > 0 and t.t_first_token is not None and t.t_first_token >= t.t_sent
    assert list(t.times) == [t.t_first_token - t.t_sent]
    assert (t.finish, t.deltas) == ("cancelled", 1) and t.t_done is not None
    assert t.t_done >= t.t_first_token
    assert closed == [True]  # the backend's stream was closed at once

    whole = Trace("local", "m")
    events = [e async for e in record(stream(), whole)]
    assert [type(e).__name__ for e in events] == ["TextDelta", "TextDelta", "Finished"]
    assert (whole.finish, whole.deltas, whole.tokens, whole.text) == ("stop", 2, 2, "ab")


def test_the_engines_and_servers_accounts_are_kept_as_they_came_the_last_of_each() -> None:
    t = Trace("remote", "m")
    progress = [PrefillProgress(100, 10, 50, 5.0), PrefillProgress(100, 10, 100, 9.0)]
    for p in progress:
        t.observe(p, 10 * MS)
    usage = Usage(100, 7, 10)
    timings = ServerTimings(90, 9.0, 7, 70.0, 10)
    account = ServerAccount("vLLM /metrics", prompt_tokens=100)
    kv = KVStats(107, 2048, 1000, 20000)
    ids = AnswerTokens((1, 2), (b"a", b"b"), "vocab")
    for event in (usage, timings, account, kv, ids):
        t.observe(event, 20 * MS)
    assert (t.progress, t.usage, t.server, t.account, t.kv, t.answer_tokens) == (
        progress[-1],
        usage,
        timings,
        account,
        kv,
        ids,
    )
    # none of them is a token: no time kept, no decode window
    assert (t.deltas, list(t.times), t.t_first_token) == (0, [], None)
