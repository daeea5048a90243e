"""TensorRT-LLM (backends/servers/tensorrt_llm.py), replayed over HTTP from fixtures
written from its documentation (tests/fixtures/servers/tensorrt-llm/): its page is read
at /prometheus/metrics, and the differences of its histograms' sums give the request's
queue (31.1 ms), prefill (98.4 ms) and time to first token (135.2 ms, so 5.7 ms of
other server time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import ServerAccount
from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST, waterfall_of
from tests.family_server import replay

FOLDER = Path(__file__).parent / "fixtures" / "servers" / "tensorrt-llm"


async def test_tensorrt_llms_prometheus_page_gives_the_waterfall() -> None:
    events, m, server = await replay(FOLDER)
    assert server.paths.count("/prometheus/metrics") == 2 and "/metrics" not in server.paths
    account = next(e for e in events if isinstance(e, ServerAccount))
    assert account.source == "TensorRT-LLM /prometheus/metrics" and account.unknown is None
    assert account.decode_ms == pytest.approx(65.5)
    wf = waterfall_of(m)
    assert wf is not None and wf.contradiction is None
    assert wf.ms(QUEUED) == pytest.approx(31.1)
    assert wf.ms(PREFILL) == pytest.approx(98.4)
    assert wf.ms(OTHER) == pytest.approx(5.7)
    assert m.ttft_ms is not None and m.sent_ms is not None
    assert wf.ms(REST) == pytest.approx(m.ttft_ms - m.sent_ms - 135.2)
