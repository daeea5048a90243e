"""SGLang (backends/servers/sglang.py), replayed over HTTP from fixtures written from its
documentation (tests/fixtures/servers/sglang/): the queue in the waterfall is the
request's own `meta_info.queue_time` (42.3 ms), not its /metrics histogram's difference
(45 ms); the server's time to first token is the /metrics difference (161.2 ms), so
its time beyond the queue is 118.9 ms; the cached prompt is the cache report's."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import ServerAccount
from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST, waterfall_of
from tests.family_server import replay

FOLDER = Path(__file__).parent / "fixtures" / "servers" / "sglang"


async def test_sglangs_meta_info_and_metrics_give_the_waterfall() -> None:
    events, m, server = await replay(FOLDER)
    account = next(e for e in events if isinstance(e, ServerAccount))
    assert account.source == "SGLang meta_info + SGLang /metrics"
    assert account.queue_ms == pytest.approx(42.3)
    assert account.ttft_ms == pytest.approx(161.2)
    assert (account.prompt_tokens, account.cached_tokens) == (36, 32)
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_prompt_tokens) == (36, 32, 4)
    wf = waterfall_of(m)
    assert wf is not None and wf.contradiction is None
    assert wf.ms(QUEUED) == pytest.approx(42.3)
    assert wf.ms(PREFILL) is None  # SGLang does not say its prefill apart
    assert wf.ms(OTHER) == pytest.approx(118.9)
    assert m.ttft_ms is not None and m.sent_ms is not None
    assert wf.ms(REST) == pytest.approx(m.ttft_ms - m.sent_ms - 161.2)
    assert server.paths.count("/metrics") == 2  # before and after
    assert set(server.requests[0]) >= {"messages", "stream"}
    assert "return_progress" not in server.requests[0]
