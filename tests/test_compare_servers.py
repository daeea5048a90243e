"""A comparison of two real servers on 127.0.0.1: llama.cpp's llama-server (which reports
its cache) and llama-cpp-python's server (which does not)."""

from __future__ import annotations

import pytest

from phasechat.backends.events import Message
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import Comparison, Side

pytestmark = pytest.mark.server

MESSAGES = (Message("system", "Be brief."), Message("user", "Name a fruit."))


@pytest.mark.parametrize("together", [True, False])
async def test_two_servers_together_or_one_after_the_other(
    real_llama_server: str, llama_server: str, together: bool
) -> None:
    a = RemoteBackend(RemoteConfig(base_url=real_llama_server, name="llama-server"))
    b = RemoteBackend(RemoteConfig(base_url=llama_server, name="python-server"))
    try:
        for backend in (a, b):
            await backend.start()
            assert backend.state == "ready", backend.state_detail
        settings = Settings(max_tokens=8, temperature=0)
        c = Comparison(
            Side("llama-server", a, settings),
            Side("python-server", b, settings),
            MESSAGES,
            together=together,
            cold=True,
        )
        assert c.together is together  # two servers may stream at once
        await c.run(2)
    finally:
        await a.aclose()
        await b.aclose()
    assert [(x.side, x.round) for x in c.answers] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    for first, second in zip(c.answers[::2], c.answers[1::2], strict=True):
        ta, tb = first.trace, second.trace
        assert ta.t_done is not None and tb.t_done is not None
        if together:  # both were sent before either finished
            assert max(ta.t_sent, tb.t_sent) < min(ta.t_done, tb.t_done)
        else:  # B was sent once A was done
            assert ta.t_done <= tb.t_sent
        # each round had its own first line: the same one on both sides, another next round
        assert first.request.messages == second.request.messages
    assert c.answers[0].request.messages[0] != c.answers[2].request.messages[0]
    rows = {row.key: row for row in c.rows()}
    # llama-server says what it had cached; the python server does not: n/a, not 0
    assert rows["cache_reuse"].a.n == 2 and rows["cache_reuse"].b.n == 0
    assert rows["cache_reuse"].b.median is None and rows["cache_reuse"].ratio is None
    assert rows["prefill_tok_s"].b.median is None
    assert rows["decode_tok_s"].a.n == 2 and rows["e2e_ms"].b.n == 2
    e2e_a, e2e_b = rows["e2e_ms"].a.median, rows["e2e_ms"].b.median
    assert e2e_a is not None and e2e_b is not None
    assert rows["e2e_ms"].ratio == pytest.approx(e2e_b / e2e_a)
