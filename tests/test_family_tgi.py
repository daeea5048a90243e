"""TGI (backends/remote/servers/tgi.py) against a stand-in written from its router's source
(tests/standins/tgi.py, huggingface/text-generation-inference@db931fcf): a two-turn chat
through the real backend and session. A streamed chat completion carries none of TGI's
timing headers, so its queue comes from the router's /metrics, read around each request;
TGI is recognised by its `/info`, whose `max_total_tokens` is the window."""

from __future__ import annotations

import pytest

from phasechat.backends.remote.servers.tgi import header_timing
from phasechat.backends.remote.wire_numbers import Fields
from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST
from tests.standins import serve
from tests.standins.chat import chat
from tests.standins.tgi import TGI, Sent


async def test_a_two_turn_chat_shows_what_tgi_measured() -> None:
    with serve(TGI) as server:
        answers, backend = await chat(server.base_url)
        said = server.record()
    sent = [Sent(**s) for s in said["sent"]]
    assert backend.family.name == "TGI"
    assert backend.window is not None
    assert (backend.window.tokens, backend.window.source) == (4096, "TGI /info max_total_tokens")
    assert said["paths"].count("/metrics") == 3  # at start, then after each answer
    for answer, one in zip(answers, sent, strict=True):
        m, wf = answer.metrics, answer.waterfall
        # the stream's headers: no timings (generate_stream_internal)
        assert set(one.headers) == {"x-compute-type", "x-compute-characters", "X-Accel-Buffering"}
        assert m.server_source == "TGI /metrics" and m.server_unknown is None
        assert m.prompt_tokens == one.prompt_tokens and m.output_tokens == one.completion_tokens
        assert m.server_queue_ms == pytest.approx(one.queue_s * 1000)
        assert m.cached_tokens is None  # TGI says nothing of its prefix cache
        assert wf is not None and wf.contradiction is None, wf
        assert wf.ms(QUEUED) == pytest.approx(one.queue_s * 1000)
        assert wf.ms(PREFILL) is None and wf.ms(OTHER) is None  # it says neither
        rest = wf.ms(REST)
        assert rest is not None and rest >= 0
        assert not m.warnings
    assert (answers[1].metrics.prompt_tokens or 0) > answers[0].metrics.output_tokens


def test_the_headers_of_a_reply_sent_whole_are_read_and_checked() -> None:
    """router/src/server.rs generate_internal's headers (whole milliseconds; a reply TGI
    sends whole, which a stream never is): each read, or named when not believable."""
    f = Fields()
    said = header_timing({"x-queue-time": "57", "x-total-time": "241", "x-prompt-tokens": "36"}, f)
    assert said is not None and (said.queue_ms, said.ttft_ms, said.prompt_tokens) == (57, 241, 36)
    assert f.notice("s") is None
    hostile = header_timing(
        {"x-queue-time": "-5", "x-total-time": "241", "x-inference-time": "1e3"}, f
    )
    assert hostile is not None and hostile.queue_ms is None and hostile.ttft_ms == 241
    line = f.notice("s")
    assert line is not None
    assert "header x-queue-time ('-5')" in line and "header x-inference-time ('1e3')" in line
    # a stream's headers say nothing of the request's times
    assert (
        header_timing({"x-compute-type": "gpu+optimized", "x-compute-characters": "90"}, f) is None
    )
