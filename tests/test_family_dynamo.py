"""NVIDIA Dynamo (backends/remote/servers/dynamo/) against a real one: its frontend with the KV
router and one mocker worker (the `dynamo` fixture, tests/dynamo_server.py), a 2-turn chat
through the real RemoteBackend and TurnController. What the server sent for each request
is tapped from the same stream phasechat read (`Tap`), and every figure phasechat shows is
set beside it: the parts of the wait under Dynamo's own meaning ("frontend: tokenize +
route" is its `prefill_wait_time_ms`, "worker: queue + prefill" its `prefill_time_ms`),
no "server, other" part (its `ttft_ms` is those two exactly: the difference is float
noise), the cached tokens and the KV hit (0.0 on the first turn is a reading, not
unknown), the worker, and the window its listing leaves unknown (`context_window: 0`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from phasechat.backends.events import ServerAccount
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.servers.dynamo import (
    ROUTING,
    WORKER,
    chunk_timing,
    listed_window,
    unknown_window,
)
from phasechat.backends.remote.windows import Window
from phasechat.backends.remote.wire_numbers import Fields
from phasechat.chat.config.file import Config
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import TurnController
from phasechat.chat.workspace import Workspace
from phasechat.telemetry.metrics import Metrics
from phasechat.telemetry.verdict import engine_says
from phasechat.telemetry.waterfall import OTHER, PREFILL, QUEUED, REST, Waterfall, waterfall_of
from tests.dynamo_server import BLOCK_SIZE, MODEL, DynamoServer
from tests.helpers import ask
from tests.otlp_receiver import Receiver, attributes


class _Recorded(httpx.AsyncByteStream):
    """A response body passed through as it is read, each piece kept."""

    def __init__(self, inner: httpx.AsyncByteStream, kept: bytearray) -> None:
        self.inner, self.kept = inner, kept

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self.inner:
            self.kept += piece
            yield piece

    async def aclose(self) -> None:
        await self.inner.aclose()


class Tap(httpx.AsyncBaseTransport):
    """The real HTTP transport, keeping each chat request's JSON and its response's bytes
    as they came: what the server sent for the very request phasechat measured."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: list[dict[str, Any]] = []
        self.bodies: list[bytearray] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        chat = request.url.path.endswith("/chat/completions")
        if chat:
            self.requests.append(json.loads(request.content))
        response = await self.inner.handle_async_request(request)
        if chat:
            kept = bytearray()
            self.bodies.append(kept)
            assert isinstance(response.stream, httpx.AsyncByteStream)
            response.stream = _Recorded(response.stream, kept)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    def chunks(self, n: int) -> list[dict[str, Any]]:
        """The n-th response's SSE chunks, parsed."""
        lines = bytes(self.bodies[n]).decode().splitlines()
        return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


@dataclass
class Chat:
    """A 2-turn chat on the real Dynamo: each turn's metrics and the server's own words."""

    backend: RemoteBackend
    metrics: list[Metrics]
    tap: Tap

    def timing(self, n: int) -> dict[str, Any]:
        """`nvext.timing` as the server sent it for turn n (on the finish chunk)."""
        said = [c["nvext"]["timing"] for c in self.tap.chunks(n) if "timing" in c.get("nvext", {})]
        assert len(said) == 1, said
        finish = [
            c for c in self.tap.chunks(n) if any(x.get("finish_reason") for x in c["choices"])
        ]
        assert "timing" in finish[0]["nvext"]
        return dict(said[0])

    def cached(self, n: int) -> int:
        """The usage's `prompt_tokens_details.cached_tokens` the server sent for turn n."""
        usage = [c["usage"] for c in self.tap.chunks(n) if c.get("usage")]
        return int(usage[-1]["prompt_tokens_details"]["cached_tokens"])

    def wait(self, n: int) -> Waterfall:
        found = waterfall_of(self.metrics[n])
        assert found is not None
        return found


#: a system prompt longer than one KV block (16 tokens), so the second turn finds the
#: first block of its prompt in the mocker's cache
SYSTEM = "You are a terse assistant. Answer in one short sentence, plainly, without lists."


async def _two_turns(server: DynamoServer) -> Chat:
    tap = Tap()
    backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model=MODEL), transport=tap)
    await backend.start()
    try:
        turns = TurnController(backend, Settings(max_tokens=8, temperature=0, system=SYSTEM))
        await ask(turns, "What is the capital of France?")
        await ask(turns, "And of Italy?")
    finally:
        await backend.aclose()
    metrics = [e.metrics for e in turns.exchanges]
    return Chat(backend, [m for m in metrics if m is not None], tap)


@pytest.fixture(scope="module")
def chat(dynamo: DynamoServer) -> Chat:
    """The chat, once for the module (its answers read back, not run again)."""
    found = asyncio.run(_two_turns(dynamo))
    assert len(found.metrics) == 2
    return found


@pytest.mark.server
async def test_each_request_asks_for_dynamo_s_timing_and_workers(chat: Chat) -> None:
    for request in chat.tap.requests:
        assert request["nvext"] == {"extra_fields": ["worker_id", "timing"]}
    # the listing says owned_by nvidia: phasechat knows it as Dynamo
    assert chat.backend.family.name == "Dynamo"


@pytest.mark.server
async def test_the_wait_s_parts_are_dynamo_s_own_figures_under_its_own_meaning(
    chat: Chat,
) -> None:
    for n, m in enumerate(chat.metrics):
        said = chat.timing(n)
        wf = chat.wait(n)
        assert m.server_source == "Dynamo nvext"
        assert m.server_queue_ms == said["prefill_wait_time_ms"]
        assert m.server_prompt_ms == said["prefill_time_ms"]
        assert m.server_ttft_ms == said["ttft_ms"]
        # Dynamo's ttft_ms is its two parts exactly: what is left is the floats' noise,
        # zero, not a part called "server, other"
        assert said["ttft_ms"] == pytest.approx(
            said["prefill_wait_time_ms"] + said["prefill_time_ms"], abs=1e-6
        )
        assert wf.ms(OTHER) is None
        assert [s.name for s in wf.steps][2:] == [QUEUED, PREFILL, REST]
        shown = {s.name: s for s in wf.steps}
        assert (shown[QUEUED].shown, shown[PREFILL].shown) == (ROUTING.name, WORKER.name)
        assert shown[QUEUED].means == ROUTING.means and shown[PREFILL].means == WORKER.means
        line = wf.line()
        assert "frontend: tokenize + route" in line and "worker: queue + prefill" in line
        assert not any(s.shown in (QUEUED, PREFILL) for s in wf.steps)
        steps = wf.as_dict()["steps"]
        assert isinstance(steps, list) and steps[2]["label"] == ROUTING.name
        # `ask --stats`'s engine line names them too, and makes no prefill rate of a
        # figure that holds the worker's queue
        says = engine_says(m)
        assert f"{ROUTING.name} {said['prefill_wait_time_ms']:,.0f} ms" in says
        assert f"{WORKER.name} {said['prefill_time_ms']:,.0f} ms" in says
        assert "tok/s" not in says
        assert m.ttft_ms is not None and m.sent_ms is not None
        if wf.contradiction is not None:
            # a busy machine: our stamp of the body's end came after the server's clock
            # began (its receipt), and its parts no longer fit after it: named, unknown
            assert m.ttft_ms - m.sent_ms < said["ttft_ms"]
            assert wf.contradiction.startswith("contradiction: Dynamo nvext says ")
            assert (wf.ms(QUEUED), wf.ms(PREFILL), wf.ms(REST)) == (None, None, None)
            continue
        assert wf.ms(QUEUED) == said["prefill_wait_time_ms"]
        assert wf.ms(PREFILL) == said["prefill_time_ms"]
        # the whole: ours is the server's own plus what neither side accounts for (none
        # where the server's clock began a fraction of a ms before our body was all out)
        rest = max(0.0, m.ttft_ms - m.sent_ms - said["ttft_ms"])
        assert wf.ms(REST) == pytest.approx(rest, abs=1e-6)


@pytest.mark.server
async def test_cached_tokens_and_the_kv_hit_are_the_server_s(chat: Chat) -> None:
    first, second = chat.metrics
    # nothing was cached before the first turn: Dynamo says 0.0, a reading, shown as 0%
    assert chat.timing(0)["kv_hit_rate"] == 0.0 and chat.cached(0) == 0
    assert first.server_kv_hit_share == 0.0
    assert "KV hit 0%" in engine_says(first)
    assert not any("kv_hit_rate" in w for w in (*first.warnings, *first.ignored))
    assert first.cached_tokens == 0
    # the second turn repeats the system prompt and the first question: whole 16-token
    # blocks of it are found, as many as the server's usage says
    cached = chat.cached(1)
    assert cached > 0 and cached % BLOCK_SIZE == 0
    assert second.cached_tokens == cached
    assert second.server_kv_hit_share == chat.timing(1)["kv_hit_rate"] > 0


@pytest.mark.server
async def test_the_worker_and_the_unknown_window_with_its_reason(chat: Chat) -> None:
    finish = next(c for c in chat.tap.chunks(0) if "timing" in c.get("nvext", {}))
    workers = finish["nvext"]["worker_id"]
    m = chat.metrics[0]
    assert m.server_prefill_worker == str(workers["prefill_worker_id"])
    assert m.server_decode_worker == str(workers["decode_worker_id"])
    # context_window 0 in its listing: Dynamo's workers declared none; unknown, and why
    assert chat.backend.context_window is None and m.context_window is None
    assert (
        m.context_source == "Dynamo lists context_window 0: its workers declared no --max-model-len"
    )


@pytest.mark.server
def test_ask_json_and_stats_name_dynamo_s_parts(dynamo: DynamoServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "phasechat", "ask", "--json", "--stats", "--backend", "openai",
         "--base-url", dynamo.base_url, "--model", MODEL, "--max-tokens", "4", "--no-save",
         "Name a colour."],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    steps = {s["name"]: s for s in record["waterfall"]["steps"]}
    assert steps[QUEUED]["label"] == ROUTING.name and steps[QUEUED]["means"] == ROUTING.means
    assert steps[PREFILL]["label"] == WORKER.name and steps[PREFILL]["means"] == WORKER.means
    assert record["server_queue_ms"] > 0
    if record["waterfall"]["contradiction"] is None:  # see the test above
        assert steps[QUEUED]["ms"] == record["server_queue_ms"]
    assert OTHER not in steps
    assert record["server_queue_name"] == ROUTING.name
    plain = subprocess.run(
        [sys.executable, "-m", "phasechat", "ask", "--stats", "--backend", "openai",
         "--base-url", dynamo.base_url, "--model", MODEL, "--max-tokens", "4", "--no-save",
         "Name a colour."],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    wait = next(x for x in plain.stderr.splitlines() if x.startswith("TTFT "))
    assert " · frontend: tokenize + route " in wait and " · worker: queue + prefill " in wait
    assert "queued" not in wait
    # and the verdict's split of the TTFT between the server and the transport
    assert "(frontend: tokenize + route " in plain.stderr or (
        "the server's worker: queue + prefill " in plain.stderr  # beyond ours: the rest
    )
    assert "(queue " not in plain.stderr and "the server's prefill" not in plain.stderr


@pytest.mark.server
async def test_the_otel_span_names_dynamo_s_parts(otlp: Receiver, dynamo: DynamoServer) -> None:
    spec = BackendSpec("openai", remote=RemoteConfig(base_url=dynamo.base_url, model=MODEL))
    ws = Workspace(Config(), spec, settings=Settings(max_tokens=4))
    await ws.backend.start()
    async for _ in ws.turns.send("Name a colour."):
        pass
    await ws.aclose()
    m = ws.turns.exchanges[-1].metrics
    assert m is not None and m.server_queue_ms is not None and m.server_prompt_ms is not None
    spans = otlp.spans()
    prefill = next(s for s in spans if s.name == "prefill")
    wait = attributes(prefill.attributes)
    assert wait["phasechat.wait.frontend_tokenize_route_ms"] == m.server_queue_ms
    assert wait["phasechat.wait.worker_queue_prefill_ms"] == m.server_prompt_ms
    assert wait["phasechat.wait.frontend_tokenize_route.means"] == ROUTING.means
    assert wait["phasechat.wait.worker_queue_prefill.means"] == WORKER.means
    assert not any(k.startswith(("phasechat.wait.queued", "phasechat.wait.prefill")) for k in wait)
    assert "phasechat.wait.server_other_ms" not in wait


def test_a_kv_hit_rate_of_zero_is_a_reading_not_unknown() -> None:
    f = Fields()
    account = chunk_timing({"nvext": {"timing": {"kv_hit_rate": 0.0, "ttft_ms": 5.0}}}, f)
    assert account is not None and account.kv_hit_share == 0.0
    assert f.ignored == []
    # beside it, what is no share is unknown and named
    f = Fields()
    account = chunk_timing({"nvext": {"timing": {"kv_hit_rate": 1.5}}}, f)
    assert account is not None and account.kv_hit_share is None
    assert f.ignored == ["nvext.timing.kv_hit_rate (1.5)"]


def test_a_chunk_with_the_workers_alone_is_no_account() -> None:
    # every chunk carries nvext.worker_id: only the finish chunk's timing is the account
    f = Fields()
    assert chunk_timing({"nvext": {"worker_id": {"prefill_worker_id": 7}}}, f) is None


def test_a_worker_id_that_is_no_id_is_named_and_never_shown() -> None:
    hostile = "\x1b]52;c;cHduZWQ=\x07"  # a clipboard write
    f = Fields()
    chunk = {
        "nvext": {
            "worker_id": {"prefill_worker_id": 7587888160958628000, "decode_worker_id": hostile},
            "timing": {"ttft_ms": 3.0},
        }
    }
    account = chunk_timing(chunk, f)
    assert account is not None
    assert (account.prefill_worker, account.decode_worker) == ("7587888160958628000", None)
    assert len(f.ignored) == 1 and f.ignored[0].startswith("nvext.decode_worker_id")
    assert "\x1b" not in f.ignored[0]


def test_a_window_the_workers_declared_is_read_and_0_is_unknown_with_its_reason() -> None:
    # the frontend's listing, as it was with the mocker's --max-model-len 2048 and without
    declared = {"id": "smol", "owned_by": "nvidia", "context_window": 2048}
    none = {"id": "smol", "owned_by": "nvidia", "context_window": 0}
    window = listed_window(declared, Fields())
    assert window is not None and (window.tokens, window.source) == (
        2048,
        "Dynamo /v1/models context_window",
    )
    assert unknown_window(declared) is None
    assert listed_window(none, Fields()) is None
    assert unknown_window(none) == (
        "Dynamo lists context_window 0: its workers declared no --max-model-len"
    )
    # another server's field of that name is not read as Dynamo's
    assert listed_window({**declared, "owned_by": "someone"}, Fields()) is None


def test_the_edges_of_what_dynamo_may_say() -> None:
    def account(timing: dict[str, Any], workers: dict[str, Any] | None = None) -> Any:
        f = Fields()
        nvext: dict[str, Any] = {"timing": timing}
        if workers is not None:
            nvext["worker_id"] = workers
        return chunk_timing({"nvext": nvext}, f), f.ignored

    # every prompt block found: 1 is a share; an int 1 is the float 1.0
    said, ignored = account({"kv_hit_rate": 1})
    assert said.kv_hit_share == 1.0 and isinstance(said.kv_hit_share, float) and not ignored
    # a hit rate that is no number is unknown and named, a bool too
    for odd in ("0.5", True):
        said, ignored = account({"kv_hit_rate": odd})
        assert said.kv_hit_share is None and len(ignored) == 1
    # worker ids are Dynamo's u64 lease ids: the largest is one, one more is not
    said, ignored = account({}, {"prefill_worker_id": 2**64 - 1, "decode_worker_id": 2**64})
    assert (said.prefill_worker, said.decode_worker) == (str(2**64 - 1), None)
    assert ignored == ["nvext.decode_worker_id (a 20-digit number)"]
    # a listing's context_window 0 is Dynamo's "none declared": no false notice of it
    f = Fields()
    assert listed_window({"owned_by": "nvidia", "context_window": 0}, f) is None
    assert f.ignored == []


def test_the_finish_chunk_s_timing_is_each_figure_under_dynamo_s_meaning() -> None:
    """Each figure from its own field (distinct values: a swapped field shows)."""
    f = Fields()
    chunk = {
        "nvext": {
            "worker_id": {"prefill_worker_id": 11, "decode_worker_id": "decode-2"},
            "timing": {
                "prefill_wait_time_ms": 1.25,
                "prefill_time_ms": 30.5,
                "ttft_ms": 31.75,
                "kv_hit_rate": 0.5,
                "total_time_ms": 99.0,
            },
        }
    }
    assert chunk_timing(chunk, f) == ServerAccount(
        "Dynamo nvext",
        queue_ms=1.25,
        prefill_ms=30.5,
        ttft_ms=31.75,
        kv_hit_share=0.5,
        prefill_worker="11",
        decode_worker="decode-2",
        queue_means=ROUTING,
        prefill_means=WORKER,
    )
    assert f.ignored == []


def test_each_timing_field_not_believed_is_named_under_its_own_name() -> None:
    f = Fields()
    timing = {"prefill_wait_time_ms": -1, "prefill_time_ms": "30", "ttft_ms": True}
    said = chunk_timing({"nvext": {"timing": timing}}, f)
    assert said is not None
    assert (said.queue_ms, said.prefill_ms, said.ttft_ms) == (None, None, None)
    assert f.ignored == [
        "nvext.timing.prefill_wait_time_ms (-1)",
        "nvext.timing.prefill_time_ms ('30')",
        "nvext.timing.ttft_ms (True)",
    ]


def test_the_workers_may_come_inside_the_timing_and_an_odd_one_is_none() -> None:
    # the timing's own `worker` where nvext.worker_id is absent or not an object
    inner = {"ttft_ms": 1.0, "worker": {"prefill_worker_id": 3, "decode_worker_id": 4}}
    for nvext in ({"timing": inner}, {"timing": inner, "worker_id": [1, 2]}):
        said = chunk_timing({"nvext": nvext}, Fields())
        assert said is not None and (said.prefill_worker, said.decode_worker) == ("3", "4")
    # nvext.worker_id first when both say
    both = {"timing": inner, "worker_id": {"prefill_worker_id": 8}}
    said = chunk_timing({"nvext": both}, Fields())
    assert said is not None and (said.prefill_worker, said.decode_worker) == ("8", None)
    # neither an object: no worker, nothing noted
    f = Fields()
    odd = {"timing": {"ttft_ms": 1.0, "worker": "w"}, "worker_id": "w"}
    said = chunk_timing({"nvext": odd}, f)
    assert said is not None and (said.prefill_worker, said.decode_worker) == (None, None)
    assert f.ignored == []


def test_a_worker_id_is_digits_or_a_short_plain_name() -> None:
    def worker(value: object) -> tuple[str | None, list[str]]:
        f = Fields()
        said = chunk_timing({"nvext": {"timing": {}, "worker_id": {"prefill_worker_id": value}}}, f)
        assert said is not None
        return said.prefill_worker, f.ignored

    assert worker(0) == ("0", [])
    assert worker(7.0) == ("7", [])  # a JSON number with a point, still an integer
    assert worker("prefill-0_a.b:1") == ("prefill-0_a.b:1", [])
    assert worker("w" * 64) == ("w" * 64, [])
    assert worker("w" * 65) == (None, [f"nvext.prefill_worker_id ({'w' * 40!r})"])
    assert worker("a b") == (None, ["nvext.prefill_worker_id ('a b')"])
    assert worker("") == (None, ["nvext.prefill_worker_id ('')"])
    assert worker(-1) == (None, ["nvext.prefill_worker_id (-1)"])
    assert worker(None) == (None, [])


def test_a_kv_hit_rate_is_a_share_from_0_to_1_inclusive() -> None:
    def hit(value: object) -> tuple[float | None, list[str]]:
        f = Fields()
        said = chunk_timing({"nvext": {"timing": {"kv_hit_rate": value}}}, f)
        assert said is not None
        return said.kv_hit_share, f.ignored

    assert hit(0) == (0.0, []) and isinstance(hit(0)[0], float)
    assert hit(0.25) == (0.25, [])
    assert hit(1.0) == (1.0, [])
    assert hit(-0.01) == (None, ["nvext.timing.kv_hit_rate (-0.01)"])
    assert hit(1.01) == (None, ["nvext.timing.kv_hit_rate (1.01)"])
    assert hit(float("nan")) == (None, ["nvext.timing.kv_hit_rate (nan)"])
    assert hit(False) == (None, ["nvext.timing.kv_hit_rate (False)"])
    assert hit(None) == (None, [])


def test_a_chunk_without_nvext_timing_is_no_account() -> None:
    f = Fields()
    chunks: tuple[dict[str, Any], ...] = (
        {"choices": []},
        {"nvext": "timing"},
        {"nvext": {"timing": [1, 2]}},
        {"nvext": {"timing": None, "worker_id": {"prefill_worker_id": 1}}},
    )
    for chunk in chunks:
        assert chunk_timing(chunk, f) is None, chunk
    assert f.ignored == []


def test_a_window_that_is_no_count_is_named_and_another_server_s_never_read() -> None:
    f = Fields()
    assert listed_window({"owned_by": "nvidia", "context_window": -5}, f) is None
    assert f.ignored == ["/v1/models context_window (-5)"]
    assert listed_window({"owned_by": "nvidia"}, f) is None  # absent: nothing to name
    assert listed_window({"owned_by": "nvidia", "context_window": 8192}, None) == Window(
        8192, "Dynamo /v1/models context_window"
    )
    assert unknown_window({"owned_by": "nvidia"}) is None
    assert unknown_window({"owned_by": "nvidia", "context_window": 8192}) is None
