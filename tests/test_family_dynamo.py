"""NVIDIA Dynamo (backends/servers/dynamo.py), replayed over HTTP from fixtures written
from its documentation (tests/fixtures/servers/dynamo/): the request asks for nvext's
timing and workers; the final chunk's nvext gives the waterfall's queue (the wait for
the prefill, 12.1 ms), prefill (70.3 ms) and the server's other time (84.9 - 82.4 ms),
and the verdict names the two workers that split the answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import ServerAccount
from phasechat.telemetry.verdict import wait
from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST, waterfall_of
from tests.family_server import replay

FOLDER = Path(__file__).parent / "fixtures" / "servers" / "dynamo"


async def test_dynamos_nvext_gives_the_waterfall_and_the_workers() -> None:
    events, m, server = await replay(FOLDER)
    assert server.requests[0]["nvext"] == {"extra_fields": ["worker_id", "timing"]}
    account = next(e for e in events if isinstance(e, ServerAccount))
    assert account.source == "Dynamo nvext"
    assert m.server_kv_hit_share == 0.875
    assert (m.server_prefill_worker, m.server_decode_worker) == (
        "7587888160958628000",
        "7587888160958628001",
    )
    wf = waterfall_of(m)
    assert wf is not None and wf.contradiction is None
    assert wf.ms(QUEUED) == 12.1 and wf.ms(PREFILL) == 70.3
    assert wf.ms(OTHER) == pytest.approx(2.5)
    assert m.ttft_ms is not None and m.sent_ms is not None
    assert wf.ms(REST) == pytest.approx(m.ttft_ms - m.sent_ms - 84.9)
    assert wait(m).endswith(
        "prefill on worker 7587888160958628000, decode on worker 7587888160958628001 "
        "(disaggregated)"
    )


async def test_a_worker_id_that_is_no_id_is_named_and_never_shown(tmp_path: Path) -> None:
    (tmp_path / "models.json").write_bytes((FOLDER / "models.json").read_bytes())
    hostile = "\\u001b]52;c;cHduZWQ=\\u0007"  # a clipboard write, as JSON escapes
    text = (FOLDER / "stream.sse").read_text().replace("7587888160958628001", f'"{hostile}"')
    (tmp_path / "stream.sse").write_text(text)
    _, m, _ = await replay(tmp_path)
    assert m.server_decode_worker is None and m.server_prefill_worker == "7587888160958628000"
    assert any("nvext.decode_worker_id" in w for w in m.warnings)
    assert not any("\x1b" in w for w in m.warnings)
