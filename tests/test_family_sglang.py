"""SGLang (backends/remote/servers/sglang.py) against a stand-in written from its source
(tests/standins/sglang.py, sgl-project/sglang at the commits it names): a two-turn chat
through the real backend and session. Its stream carries no `meta_info` (it refuses
`return_meta_info` with `stream: true`); the cache comes from the `sglext` chunk phasechat
asks for and from the usage; the queue and the server's time to first token from its
/metrics histograms, read around each request."""

from __future__ import annotations

import pytest

from phasechat.backends.events import ServerAccount, StreamError
from phasechat.backends.remote.servers.sglang import chunk_timing, listed_window
from phasechat.backends.remote.windows import Window
from phasechat.backends.remote.wire_numbers import Fields
from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST
from tests.standins import serve
from tests.standins.chat import chat
from tests.standins.sglang import Sent, SGLang


async def test_a_two_turn_chat_shows_what_sglang_sent() -> None:
    with serve(SGLang) as server:
        answers, backend = await chat(server.base_url)
        said = server.record()
    sent = [Sent(**s) for s in said["sent"]]
    assert backend.window is not None
    assert (backend.window.tokens, backend.window.source) == (
        4096,
        "SGLang /v1/models max_model_len",
    )
    assert all(b["return_cached_tokens_details"] is True for b in said["bodies"])
    assert not any("return_meta_info" in b for b in said["bodies"])
    assert said["paths"].count("/metrics") == 3  # at start, then after each answer
    for answer, one in zip(answers, sent, strict=True):
        m, wf = answer.metrics, answer.waterfall
        assert m.server_source == "SGLang sglext + SGLang /metrics", m.server_unknown
        assert (m.prompt_tokens, m.cached_tokens) == (one.prompt_tokens, one.cached_tokens)
        assert m.server_queue_ms == pytest.approx(one.queue_s * 1000)
        assert m.server_ttft_ms == pytest.approx(one.ttft_s * 1000)
        assert wf is not None and wf.contradiction is None, wf
        assert wf.ms(QUEUED) == pytest.approx(one.queue_s * 1000)
        assert wf.ms(PREFILL) is None  # SGLang does not say its prefill apart
        assert wf.ms(OTHER) == pytest.approx((one.ttft_s - one.queue_s) * 1000)
        rest = wf.ms(REST)
        assert rest is not None and rest >= 0
        assert not m.warnings
    first, second = sent
    assert first.cached_tokens == 0 and first.details == {"device": 0, "host": 0}
    assert first.usage is not None and first.usage["prompt_tokens_details"] is None
    # the second turn's prompt holds the first turn's prompt and answer: cached
    assert second.cached_tokens > first.prompt_tokens
    assert answers[1].metrics.cached_tokens == second.cached_tokens


async def test_sglang_refuses_meta_info_on_a_stream_and_phasechat_never_asks() -> None:
    with serve(SGLang) as server:
        answers, _ = await chat(server.base_url, ("Hi",), extra_body={"return_meta_info": True})
        said = server.record()
    error = next(e for e in answers[0].events if isinstance(e, StreamError))
    assert error.status == 400
    assert "return_meta_info is not supported with streaming" in error.message
    assert said["sent"] == []  # refused before any work


async def test_more_cached_than_the_prompt_is_not_believed() -> None:
    """The only cached figure is the sglext chunk's (no cache report, no /metrics), and
    it says more than the prompt holds: unknown, and said."""
    options = {"device": 900, "host": 100}
    with serve(
        SGLang, enable_metrics=False, enable_cache_report=False, details_override=options
    ) as server:
        answers, _ = await chat(server.base_url, ("Why is the sky blue?",))
        said = server.record()
    m = answers[0].metrics
    assert m.prompt_tokens == said["sent"][0]["prompt_tokens"] < 1000
    assert m.cached_tokens is None and m.evaluated_prompt_tokens is None
    assert any("1,000 cached tokens of a prompt of at most" in w for w in m.warnings)


async def test_without_its_flags_the_cache_comes_from_sglext_and_the_queue_is_unknown() -> None:
    """`--enable-metrics` and `--enable-cache-report` off: /metrics is a 404, the usage
    says nothing of the cache; the sglext chunk still says it (0 on the first turn is a
    known zero), and the server's parts of the wait are unknown."""
    with serve(SGLang, enable_metrics=False, enable_cache_report=False) as server:
        answers, _ = await chat(server.base_url)
        said = server.record()
    assert said["paths"].count("/metrics") == 1  # asked once at start: a 404
    why = "SGLang serves /metrics only when it runs with --enable-metrics"
    assert any(why in w for w in answers[0].metrics.warnings)  # said once
    assert not any(why in w for w in answers[1].metrics.warnings)
    for answer, one in zip(answers, said["sent"], strict=True):
        m, wf = answer.metrics, answer.waterfall
        assert one["usage"]["prompt_tokens_details"] is None
        assert m.cached_tokens == one["cached_tokens"] and m.server_source == "SGLang sglext"
        assert m.server_queue_ms is None and m.server_ttft_ms is None
        assert wf is not None and wf.ms(QUEUED) is None and wf.ms(OTHER) is None
    assert answers[0].metrics.cached_tokens == 0 and answers[1].metrics.cached_tokens


def sglext(details: object) -> dict[str, object]:
    return {"id": "x", "choices": [], "sglext": {"cached_tokens_details": details}}


def test_the_sglext_chunk_s_tiers_are_added_up() -> None:
    f = Fields()
    assert chunk_timing(sglext({"device": 5, "host": 3}), f) == ServerAccount(
        "SGLang sglext", cached_tokens=8
    )
    assert chunk_timing(sglext({"device": 5, "host": 3, "storage": 20}), f) == ServerAccount(
        "SGLang sglext", cached_tokens=28
    )
    # storage alone (an L3 backend): one tier is enough; 0 everywhere is a known 0
    assert chunk_timing(sglext({"storage": 7}), f) == ServerAccount(
        "SGLang sglext", cached_tokens=7
    )
    assert chunk_timing(sglext({"device": 0, "host": 0}), f) == ServerAccount(
        "SGLang sglext", cached_tokens=0
    )
    assert f.ignored == []


def test_a_tier_not_believed_makes_the_whole_unknown_and_is_named() -> None:
    for odd, shown in ((-1, "-1"), ("5", "'5'"), (1.5, "1.5")):
        f = Fields()
        assert chunk_timing(sglext({"device": 5, "host": odd}), f) is None
        assert f.ignored == [f"sglext.cached_tokens_details.host ({shown})"]


def test_a_chunk_without_the_tiers_is_no_account() -> None:
    f = Fields()
    chunks: tuple[dict[str, object], ...] = (
        {"id": "x", "choices": [{"delta": {"content": "hi"}}]},
        {"sglext": None},
        {"sglext": ["cached_tokens_details"]},
        {"sglext": {}},
        sglext(None),
        sglext([5, 3]),
        sglext({}),
        sglext({"gpu": 5}),  # no tier SGLang names
    )
    for chunk in chunks:
        assert chunk_timing(chunk, f) is None, chunk
    assert f.ignored == []


def test_sglang_s_listed_window_is_its_max_model_len() -> None:
    f = Fields()
    assert listed_window({"id": "m", "max_model_len": 4096}, f) == Window(
        4096, "SGLang /v1/models max_model_len"
    )
    assert listed_window({"id": "m"}, f) is None
    assert f.ignored == []
    for odd in (0, -1, "4096"):
        f = Fields()
        assert listed_window({"id": "m", "max_model_len": odd}, f) is None
        assert f.ignored == [f"max_model_len ({odd!r})"]
    assert listed_window({"id": "m", "max_model_len": 0}, None) is None
