"""vLLM's per-request metrics (`--enable-per-request-metrics`), replayed over HTTP from
a fixture written from vLLM's source (tests/fixtures/servers/vllm-per-request/): the
queue and the prefill in the waterfall are the final chunk's own, and the rest is what
the TTFT measured here leaves after the send."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import ServerAccount
from phasechat.telemetry.waterfall import PREFILL, QUEUED, REST, waterfall_of
from tests.family_server import replay

FOLDER = Path(__file__).parent / "fixtures" / "servers" / "vllm-per-request"


async def test_vllms_per_request_metrics_give_the_waterfall() -> None:
    events, m, server = await replay(FOLDER)
    account = next(e for e in events if isinstance(e, ServerAccount))
    assert account.source == "vLLM per-request metrics"
    assert (account.queue_ms, account.prefill_ms, account.decode_ms) == (35.5, 110.25, 52.0)
    wf = waterfall_of(m)
    assert wf is not None and wf.contradiction is None
    assert wf.ms(QUEUED) == 35.5 and wf.ms(PREFILL) == 110.25
    assert m.ttft_ms is not None and m.sent_ms is not None
    assert wf.ms(REST) == pytest.approx(m.ttft_ms - m.sent_ms - 145.75)
    assert "/metrics" in server.paths  # vLLM always has a page: asked, a 404 here
    assert "return_progress" not in server.requests[0]  # llama-server's extra only
