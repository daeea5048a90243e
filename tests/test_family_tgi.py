"""TGI (backends/servers/tgi.py), replayed over HTTP from fixtures written from its
documentation (tests/fixtures/servers/tgi/): a reply sent whole with TGI's timing
headers. The waterfall's queue is `x-queue-time` (57 ms); the rest of the server's
`x-total-time` (241 ms: validation 3 + inference 181) is its other time, 184 ms; the
rest is what the client waited beyond the send and those 241 ms."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import ServerAccount
from phasechat.telemetry.waterfall import OTHER, QUEUED, REST, waterfall_of
from tests.family_server import replay

FOLDER = Path(__file__).parent / "fixtures" / "servers" / "tgi"


async def test_tgis_headers_give_the_waterfall() -> None:
    events, m, server = await replay(FOLDER)
    account = next(e for e in events if isinstance(e, ServerAccount))
    assert account.source == "TGI headers"
    assert (account.queue_ms, account.ttft_ms) == (57.0, 241.0)
    assert (account.prompt_tokens, account.generated_tokens) == (36, 4)
    wf = waterfall_of(m)
    assert wf is not None and wf.contradiction is None
    assert wf.ms(QUEUED) == 57.0 and wf.ms(OTHER) == 184.0
    assert m.ttft_ms is not None and m.sent_ms is not None
    assert wf.ms(REST) == pytest.approx(m.ttft_ms - m.sent_ms - 241.0)
    assert not any(p.endswith("metrics") for p in server.paths)  # TGI's are not read


async def test_a_header_that_is_no_plausible_time_is_named_and_unknown(tmp_path: Path) -> None:
    for name in ("models.json", "reply.json"):
        (tmp_path / name).write_bytes((FOLDER / name).read_bytes())
    said = '{"headers": {"x-queue-time": "-5", "x-total-time": "241", "x-inference-time": "1e3"}}'
    (tmp_path / "headers.json").write_text(said)
    _, m, _ = await replay(tmp_path)
    assert m.server_queue_ms is None
    line = next(w for w in m.warnings if "x-queue-time" in w)
    assert "header x-queue-time ('-5')" in line and "header x-inference-time ('1e3')" in line
