"""vLLM's per-request metrics (`--enable-per-request-metrics`), replayed over HTTP from
a fixture written from vLLM's source (tests/fixtures/servers/vllm-per-request/): the
queue and the prefill in the waterfall are the final chunk's own, and the rest is what
the TTFT measured here leaves after the send."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import GenerationRequest, Message, ServerAccount
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record
from phasechat.telemetry.waterfall import PREFILL, QUEUED, REST, waterfall_of
from tests.family_server import replay
from tests.vllm_server import MODEL, VllmServer

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


@pytest.mark.server
async def test_a_real_vllm_with_per_request_metrics_gives_its_own_queue_and_prefill(
    vllm_per_request: VllmServer,
) -> None:
    """The fixture's fields as the vLLM set up here sends them: the request's own queue
    and prefill, joined with /metrics' account of the same request, fitting the TTFT."""
    server = vllm_per_request
    backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model=MODEL))
    await backend.start()
    trace = Trace(backend.name, MODEL, window=backend.context_window)
    request = GenerationRequest((Message("user", "Say hi."),), max_tokens=8, temperature=0)
    events = [e async for e in record(backend.stream(request), trace)]
    await backend.aclose()
    account = next(e for e in events if isinstance(e, ServerAccount))
    assert account.source == "vLLM per-request metrics + vLLM /metrics"
    assert account.queue_ms is not None and account.prefill_ms is not None
    wf = waterfall_of(compute(trace))
    assert wf is not None and wf.contradiction is None
    assert wf.ms(QUEUED) == account.queue_ms and wf.ms(PREFILL) == account.prefill_ms
