"""A server's account at its edges (backends/server_metrics.py; issue 49, item 3): each
bound at its value and one past it, pages that declare what they have not counted yet,
and how long the watch waits for a server to count a request, on a clock of its own
(the reads are counted, not timed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine

import httpx
import pytest

from phasechat.backends.events import (
    Finished,
    GenerationRequest,
    Message,
    ServerAccount,
    Usage,
)
from phasechat.backends.remote import server_metrics
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.server_metrics import MetricsWatch, Span, joined, parse
from phasechat.backends.remote.servers.llama_server import FAMILY as LLAMA
from phasechat.backends.remote.servers.sglang import FAMILY as SGLANG
from phasechat.backends.remote.wire_numbers import MAX_TOKENS

SPAN = Span(1000.0, 4000, 100)


# -- what a server's per-request figures may claim ------------------------------------


@pytest.mark.parametrize(("prefill", "kept"), [(1051.0, True), (1051.5, False), (1050.5, True)])
def test_a_phase_may_exceed_the_request_by_5_percent_and_1_ms_and_no_more(
    prefill: float, kept: bool
) -> None:
    # 1,000 ms measured here: 1,051 ms is at the clocks' slack, 1,051.5 past it
    a = joined(ServerAccount("vLLM per-request metrics", prefill_ms=prefill), None, SPAN)
    assert a is not None and (a.prefill_ms == prefill) is kept
    assert len(a.doubts) == (0 if kept else 1)


def test_each_phase_longer_than_the_request_is_named_with_its_label() -> None:
    own = ServerAccount("Dynamo per-request metrics", load_ms=2_000, ttft_ms=3_000, decode_ms=4_000)
    a = joined(own, None, SPAN)
    assert a is not None and (a.load_ms, a.ttft_ms, a.decode_ms) == (None, None, None)
    assert a.doubts == (
        "Dynamo per-request metrics: 2,000 ms of model load, 4,000 ms of decode, "
        "3,000 ms of time to first token in a request of 1,000 ms measured here: not believed",
    )


def test_cached_tokens_are_bounded_by_the_prompt_counted_or_else_by_the_prompt_sent() -> None:
    # SGLang's own count of cached tokens, with the prompt count: 35 cached of 30
    over = joined(ServerAccount("SGLang", prompt_tokens=30, cached_tokens=35), None, SPAN)
    assert over is not None and (over.prompt_tokens, over.cached_tokens) == (30, None)
    assert over.doubts == ("SGLang: 35 cached tokens of a prompt of at most 30: not believed",)
    # the whole prompt cached: believed
    whole = joined(ServerAccount("SGLang", prompt_tokens=30, cached_tokens=30), None, SPAN)
    assert whole is not None and whole.cached_tokens == 30 and whole.doubts == ()
    # no prompt count: the prompt sent bounds it (4,000), at the bound and one past it
    span = Span(1000.0, 40, 100)
    at = joined(ServerAccount("SGLang", cached_tokens=40), None, span)
    assert at is not None and at.cached_tokens == 40 and at.doubts == ()
    past = joined(ServerAccount("SGLang", cached_tokens=41), None, span)
    assert past is not None and past.cached_tokens is None
    assert past.doubts == ("SGLang: 41 cached tokens of a prompt of at most 40: not believed",)


def test_a_prompt_not_believed_takes_its_cached_count_with_it_in_one_line() -> None:
    # 5,000 prompt tokens of at most 4,000, 6,000 of them cached: one line, the prompt's
    own = ServerAccount("SGLang", prompt_tokens=5_000, cached_tokens=6_000)
    a = joined(own, None, SPAN)
    assert a is not None and (a.prompt_tokens, a.cached_tokens) == (None, None)
    assert a.doubts == ("SGLang: 5,000 prompt tokens for a prompt of at most 4,000: not believed",)


def test_phases_that_do_not_fit_together_leave_the_counts_that_were_not_believed_out() -> None:
    own = ServerAccount(
        "vLLM per-request metrics", prompt_tokens=5_000, prefill_ms=600, decode_ms=600
    )
    a = joined(own, None, SPAN)
    assert a is not None
    assert (a.prompt_tokens, a.prefill_ms, a.decode_ms) == (None, None, None)
    assert len(a.doubts) == 2 and "1,200 ms of prefill + decode" in a.doubts[1]


# -- pages that declare figures before they count them --------------------------------

#: a fresh SGLang server's page (prometheus_client): counters and histograms declared,
#: a label set written only once it counted something
FRESH_SGLANG = (
    "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n"
    "# TYPE sglang:cached_tokens_total counter\n"
    "# TYPE sglang:queue_time_seconds histogram\n"
    "# TYPE sglang:time_to_first_token_seconds summary\n"
    "# TYPE sglang:generation_tokens_total\n"  # no kind: not a declaration
    "# TYPE sglang:num_requests_total counter extra\n"  # five words: neither
    'sglang:prompt_tokens_total{model_name="m"} 12\n'
)


def test_a_declared_figure_with_no_sample_is_zero_and_a_malformed_declaration_nothing() -> None:
    s = parse(FRESH_SGLANG)
    assert s is not None and s.engine == "SGLang"
    assert s.values == {"prompt": 12.0, "cached": 0.0, "queue_s": 0.0, "ttft_s": 0.0}


def test_a_page_that_only_declares_its_names_is_its_family_s() -> None:
    s = parse("# TYPE sglang:num_running_reqs gauge\n# TYPE sglang:token_usage gauge\n")
    assert s is not None and s.engine == "SGLang"
    assert s.values == {"running": 0.0, "used_share": 0.0}


# -- the watch, on a clock of its own -------------------------------------------------


class Clock:
    """`time.monotonic` and `asyncio.sleep` for the watch: each sleep asked for is kept
    and moves the clock a quarter second (an exact binary fraction: the reads land on
    SETTLE_S itself)."""

    def __init__(self) -> None:
        self.now, self.sleeps = 100.0, list[float]()

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += 0.25


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(server_metrics, "time", c)
    monkeypatch.setattr(asyncio, "sleep", c.sleep)  # the module server_metrics sleeps in
    return c


class Pages:
    """A /metrics that answers each page in turn (the last again), and only to `key`."""

    def __init__(self, *pages: str, key: str | None = None) -> None:
        self.pages, self.reads, self.key = list(pages), 0, key

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.key is not None and request.headers.get("authorization") != self.key:
            return httpx.Response(401)
        page = self.pages[min(self.reads, len(self.pages) - 1)]
        self.reads += 1
        return httpx.Response(200, text=page)


async def one_request(
    pages: Pages, usage: Usage | None, family: str = "", headers: dict[str, str] | None = None
) -> tuple[ServerAccount | None, MetricsWatch]:
    names = {"llama": LLAMA, "sglang": SGLANG}[family].metrics if family else None
    headers = headers or {}
    watch = MetricsWatch()
    async with httpx.AsyncClient(transport=httpx.MockTransport(pages.handle)) as client:
        await watch.start(client, "http://h", headers, names=names)
        ticket = watch.begin()
        got = await watch.finished(ticket, client, "http://h", headers, usage)
        watch.end()
    return got, watch


def llama_page(generated: float, cached: float = 0, running: float = 0) -> str:
    return (
        f"llamacpp:requests_processing {running}\nllamacpp:prompt_tokens_total 100\n"
        f"llamacpp:prompt_tokens_cached_total {cached}\n"
        f"llamacpp:tokens_predicted_total {generated}\n"
    )


async def test_llama_server_is_read_again_until_it_counted_every_token_of_the_answer(
    clock: Clock,
) -> None:
    # llama-server has no count of finished requests: its tokens say when it counted
    pages = Pages(llama_page(40), llama_page(45), llama_page(52))
    got, _ = await one_request(pages, Usage(None, 12))
    assert got is not None and got.unknown is None and got.generated_tokens == 12
    assert pages.reads == 3 and clock.sleeps == [0.05]


@pytest.mark.parametrize("usage", [None, Usage(80, None)])
async def test_without_a_count_of_its_own_one_token_counted_is_enough(
    clock: Clock, usage: Usage | None
) -> None:
    # the answer's usage names no count: one token counted is the request counted
    pages = Pages(llama_page(40), llama_page(41))
    got, _ = await one_request(pages, usage)
    assert got is not None and got.generated_tokens == 1 and pages.reads == 2


async def test_a_server_that_never_counts_is_read_every_50_ms_until_settle_s_has_passed(
    clock: Clock,
) -> None:
    pages = Pages(llama_page(40))
    got, _ = await one_request(pages, Usage(None, 12))
    # reads at 0, 0.25, ..., 1.5 s (SETTLE_S itself: not yet past) and 1.75 s
    assert pages.reads == 1 + 8 and clock.sleeps == [0.05] * 7
    # nothing moved: the server's count disagrees with the answer's
    assert got is not None and got.unknown is not None and got.unknown.startswith("mismatch")


def vllm_page(finished: float, generated: float, broken: bool = False) -> str:
    dup = 'vllm:prompt_tokens_total{engine="1"} 1e308\n' * (2 if broken else 1)
    return (
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        f"vllm:e2e_request_latency_seconds_count {finished}\n"
        f"vllm:generation_tokens_total {generated}\n" + dup
    )


@pytest.mark.parametrize(
    ("before", "after", "unknown"),
    [
        # the prompt count's lines sum to infinity before, after, or at both reads
        (vllm_page(5, 50, broken=True), vllm_page(5, 50), "no number"),
        (vllm_page(5, 50), vllm_page(5, 50, broken=True), "no number"),
        # the server restarted: its counts went back, and the request is not counted yet
        (vllm_page(5, 50), vllm_page(0, 0), "restarted"),
    ],
)
async def test_a_page_no_wait_can_mend_is_read_once(
    clock: Clock, before: str, after: str, unknown: str
) -> None:
    pages = Pages(before, after)
    got, _ = await one_request(pages, Usage(None, 12))
    assert got is not None and got.unknown is not None and unknown in got.unknown
    assert pages.reads == 2 and clock.sleeps == []


async def test_a_finished_count_that_moved_is_enough_even_when_the_tokens_disagree(
    clock: Clock,
) -> None:
    # vLLM counted the request (finished 5 -> 6) and 9 tokens of the 12 it said
    pages = Pages(vllm_page(5, 50), vllm_page(6, 59))
    got, _ = await one_request(pages, Usage(None, 12))
    assert got is not None and got.unknown is not None and got.unknown.startswith("mismatch")
    assert pages.reads == 2


async def test_more_tokens_than_the_answer_s_are_another_request_s(clock: Clock) -> None:
    pages = Pages(vllm_page(5, 50), vllm_page(6, 80))
    got, _ = await one_request(pages, Usage(None, 12))
    assert got is not None and got.unknown == (
        "the server generated 30 tokens meanwhile, this answer 12: "
        "other requests ran at the same time"
    )


async def test_counters_a_server_writes_once_it_counts_start_from_zero(clock: Clock) -> None:
    # SGLang's page before the request has no finished count yet; after, 1
    before = "sglang:num_running_reqs 0\n"
    after = "sglang:num_running_reqs 0\nsglang:num_requests_total 1\n"
    pages = Pages(before, after)
    got, _ = await one_request(pages, None)
    assert got is not None and got.unknown is None and pages.reads == 2


async def test_a_counter_gone_from_the_page_after_a_restart_gives_no_figures(
    clock: Clock,
) -> None:
    before = vllm_page(5, 50)
    after = "vllm:num_requests_running 0\n"  # restarted, nothing counted yet
    got, _ = await one_request(Pages(before, after), Usage(None, 12))
    assert got is not None and (got.generated_tokens, got.prompt_tokens) == (None, None)


async def test_a_family_s_page_that_holds_none_of_its_names_yet_is_still_its_account(
    clock: Clock,
) -> None:
    # llama-server said it serves /metrics; its page has nothing of llama.cpp's yet
    pages = Pages("process_open_fds 12\n")
    got, watch = await one_request(pages, None, family="llama")
    assert watch.enabled and got is not None and got.source == "llama-server /metrics"
    assert pages.reads == 2  # nothing there to wait for: read once after the answer


async def test_the_page_is_read_with_the_backend_s_key(clock: Clock) -> None:
    pages = Pages(llama_page(40), llama_page(52), key="Bearer k")
    got, _ = await one_request(pages, Usage(None, 12), headers={"authorization": "Bearer k"})
    assert got is not None and got.generated_tokens == 12


async def test_after_a_read_that_failed_the_next_request_has_no_before(clock: Clock) -> None:
    reads = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal reads
        reads += 1
        if reads == 2:  # the read after the first request fails
            return httpx.Response(503)
        return httpx.Response(200, text=llama_page(40 + 12 * (reads > 2)))

    watch = MetricsWatch()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        await watch.start(client, "http://h", {})
        first = await watch.finished(watch.begin(), client, "http://h", {}, Usage(None, 12))
        watch.end()
        assert first is None and watch.last is None
        second = await watch.finished(watch.begin(), client, "http://h", {}, Usage(None, 12))
        watch.end()
    assert second is not None and second.unknown == "no earlier read of /metrics to compare with"


# -- a counter first written after the send (issue 49, item 3: mutants of _start) -----


def test_a_counter_first_written_after_the_send_counts_from_zero() -> None:
    # SGLang writes its cached and finished counts once they first count something
    before = parse("sglang:num_running_reqs 0\nsglang:prompt_tokens_total 100\n")
    one = parse(
        "sglang:num_running_reqs 0\nsglang:prompt_tokens_total 130\n"
        "sglang:cached_tokens_total 24\nsglang:num_requests_total 1\n"
    )
    assert one is not None
    a = server_metrics.account(before, one, None)
    assert a.unknown is None and (a.prompt_tokens, a.cached_tokens) == (30, 24)
    # two finished since the send, the first count written meanwhile: not this request's
    two = parse("sglang:num_running_reqs 0\nsglang:num_requests_total 2\n")
    assert two is not None
    crowd = server_metrics.account(before, two, None)
    assert crowd.unknown == "2 requests finished on the server meanwhile, not 1"


# -- one account of two sources keeps both sources' doubts, in order ----------------


def test_an_account_of_both_sources_keeps_the_doubts_of_each() -> None:
    own = ServerAccount("vLLM per-request metrics", prefill_ms=2_000.0, queue_ms=5.0)
    scraped = ServerAccount(
        "vLLM /metrics", decode_ms=10.0, doubts=("vLLM /metrics: 9 tokens: not believed",)
    )
    a = joined(own, scraped, SPAN)
    assert a is not None and (a.queue_ms, a.prefill_ms, a.decode_ms) == (5.0, None, 10.0)
    assert a.doubts == (
        "vLLM per-request metrics: 2,000 ms of prefill in a request of 1,000 ms measured "
        "here: not believed",
        "vLLM /metrics: 9 tokens: not believed",
    )


# -- a scrape's page: where, how long, how large, what bytes ------------------------

VLLM_LINE = "vllm:prompt_tokens_total 7\n"
Handler = (
    Callable[[httpx.Request], httpx.Response]
    | Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]
)


async def read_page(handle: Handler) -> server_metrics.Scrape | None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        return await server_metrics.scrape(client, "http://h", {})


async def test_a_page_that_trickles_past_the_deadline_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each piece comes well within any read timeout; the whole page does not
    monkeypatch.setattr(server_metrics, "DEADLINE_S", 0.2)
    sent: list[int] = []

    async def trickle() -> AsyncIterator[bytes]:
        for n in range(20):
            sent.append(n)
            yield VLLM_LINE.encode() if n == 0 else b"# more\n"
            await asyncio.sleep(0.05)

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=trickle())

    assert await read_page(handle) is None
    assert len(sent) < 20  # given up on before its end


@pytest.mark.parametrize(
    ("size", "read"), [(1_500_000, True), (4 << 20, True), ((4 << 20) + 1, False)]
)
async def test_a_page_of_up_to_4_mib_is_read_and_a_longer_one_is_none(
    size: int, read: bool
) -> None:
    page = VLLM_LINE + "#" * (size - len(VLLM_LINE) - 1) + "\n"
    assert len(page) == size

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=page)

    s = await read_page(handle)
    assert (s is not None and s.values == {"prompt": 7.0}) is read
    assert read or s is None


async def test_bytes_that_are_no_utf_8_are_replaced_not_fatal() -> None:
    raw = b'vllm:num_requests_running{model_name="caf\xff"} 0\n# \xc3\n' + VLLM_LINE.encode()

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=raw)

    s = await read_page(handle)
    assert s is not None and s.values == {"running": 0.0, "prompt": 7.0}


# -- the last of a client's requests at once reads the next "before" ----------------


async def test_the_last_of_requests_at_once_reads_with_the_key_and_the_family_s_names(
    clock: Clock,
) -> None:
    # llama-server's page behind a key, holding none of llama.cpp's names yet: read
    # without the key, or without the family's names, it is no "before"
    pages = Pages("process_open_fds 12\n", key="Bearer k")
    headers = {"authorization": "Bearer k"}
    watch = MetricsWatch()
    async with httpx.AsyncClient(transport=httpx.MockTransport(pages.handle)) as client:
        await watch.start(client, "http://h", headers, names=LLAMA.metrics)
        first, second = watch.begin(), watch.begin()
        crowded = await watch.finished(first, client, "http://h", headers, None)
        watch.end()
        assert crowded is not None and crowded.unknown == server_metrics.CROWDED
        assert pages.reads == 1  # another is still running: not read for
        await watch.finished(second, client, "http://h", headers, None)
        watch.end()
        assert pages.reads == 2 and watch.last is not None
        alone = await watch.finished(watch.begin(), client, "http://h", headers, None)
        watch.end()
    assert alone is not None and alone.unknown is None
    assert alone.source == "llama-server /metrics"


# -- a server of no family with a page: not read for ---------------------------------


async def test_a_server_whose_family_has_no_page_is_never_read_for_one() -> None:
    asked: list[str] = []

    async def stream(text: str) -> AsyncIterator[bytes]:
        yield text.encode()

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        asked.append(path)
        if path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "someone"}]})
        if path == "/metrics":  # a vLLM page, though nothing said it serves one
            return httpx.Response(200, text="vllm:num_requests_running 0\n" + VLLM_LINE)
        if path.endswith("/chat/completions"):
            sse = (
                'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'
                '\n\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
                "\n\ndata: [DONE]\n\n"
            )
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=stream(sse)
            )
        return httpx.Response(404)

    config = RemoteConfig(base_url="http://plain.test/v1", model="m")
    backend = RemoteBackend(config, transport=httpx.MockTransport(handle))
    await backend.start()
    request = GenerationRequest((Message("user", "hi"),), max_tokens=8)
    events = [e async for e in backend.stream(request)]
    await backend.aclose()
    assert any(isinstance(e, Finished) for e in events)
    assert not any(isinstance(e, ServerAccount) for e in events)
    assert "/metrics" not in asked


# -- a page's lines and a count's bounds, each at its value and one past it ----------


def vllm(**figures: float) -> server_metrics.Scrape:
    """A vLLM page of these figures (`prompt=...`: vllm:prompt_tokens_total), nothing
    running."""
    names = {
        "finished": "vllm:e2e_request_latency_seconds_count",
        "prompt": "vllm:prompt_tokens_total",
        "cached": "vllm:prompt_tokens_cached_total",
        "generated": "vllm:generation_tokens_total",
        "prefill": "vllm:request_prefill_time_seconds_sum",
    }
    lines = ["vllm:num_requests_running 0"] + [f"{names[k]} {v!r}" for k, v in figures.items()]
    s = parse("\n".join(lines) + "\n")
    assert s is not None
    return s


def test_a_line_that_is_no_sample_is_skipped_and_the_page_read_on() -> None:
    s = parse("vllm:num_requests_running 0\nvllm:prompt_tokens_total\nvllm:prompt_tokens_total 7\n")
    assert s is not None and s.values == {"running": 0.0, "prompt": 7.0}


@pytest.mark.parametrize(("digits", "read"), [(12, True), (13, False)])
def test_a_block_size_of_12_digits_is_read_and_of_13_is_not(digits: int, read: bool) -> None:
    size = 10 ** (digits - 1)
    info = f'vllm:cache_config_info{{block_size="{size}",num_gpu_blocks="2"}} 1\n'
    s = parse(info + "vllm:num_requests_running 0\n")
    assert s is not None and s.block_tokens == (size if read else None)
    assert s.pool_tokens is None  # two blocks of that size: past MAX_POOL either way


def test_no_cached_token_is_a_count_of_zero_not_unknown() -> None:
    before = vllm(finished=5, prompt=100, cached=40, generated=50)
    after = vllm(finished=6, prompt=130, cached=40, generated=62)
    a = server_metrics.account(before, after, Usage(30, 12))
    assert (a.prompt_tokens, a.cached_tokens, a.generated_tokens) == (30, 0, 12)


@pytest.mark.parametrize(("more", "kept"), [(0, True), (1, False)])
def test_a_count_of_up_to_max_tokens_is_kept(more: int, kept: bool) -> None:
    prompt = MAX_TOKENS + more
    a = server_metrics.account(vllm(finished=5, prompt=0), vllm(finished=6, prompt=prompt), None)
    assert a.prompt_tokens == (prompt if kept else None)


@pytest.mark.parametrize(("seconds", "kept"), [(86_399.5, True), (86_400.0, False)])
def test_a_phase_of_under_a_day_is_kept_and_of_a_day_is_not(seconds: float, kept: bool) -> None:
    a = server_metrics.account(
        vllm(finished=5, prefill=10.0), vllm(finished=6, prefill=10.0 + seconds), None
    )
    assert a.prefill_ms == (seconds * 1000 if kept else None)


def test_each_reason_a_difference_is_no_account_is_said_in_full() -> None:
    llama = parse("llamacpp:prompt_tokens_total 10\n")
    assert llama is not None
    changed = server_metrics.account(vllm(finished=5), llama, None)
    assert changed.unknown == "the server changed between the two reads of /metrics"
    gone = server_metrics.account(vllm(finished=5), vllm(finished=0), None)
    assert gone.unknown == (
        "the server's count of finished requests went back from 5 to 0: it restarted, "
        "and this request has no account"
    )
    # a figure that is no counter, its lines summing to no number, is named by itself
    broken = parse("vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n")
    assert broken is not None
    crowd = server_metrics.account(vllm(finished=5), broken, None)
    assert crowd.unknown == "the server's running figures are no number (its lines sum to inf)"


async def test_a_scrape_and_a_watch_read_slash_metrics_with_a_get_unless_told_otherwise() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method != "GET":
            return httpx.Response(405)
        found = request.url.path == "/metrics"
        return httpx.Response(200 if found else 404, text=VLLM_LINE if found else "")

    s = await read_page(handle)
    assert s is not None and s.values == {"prompt": 7.0}
    watch = MetricsWatch()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        await watch.start(client, "http://h", {})
    assert watch.enabled and watch.last is not None and watch.last.values == {"prompt": 7.0}


async def test_a_page_has_its_own_deadline_not_the_client_s_shorter_timeouts() -> None:
    # a real server on 127.0.0.1 that answers after 0.3 s, asked by a client whose
    # own timeouts are 0.1 s (a profile's short connect and read timeouts)
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.3)
        body = VLLM_LINE.encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(timeout=0.1) as client:
            s = await server_metrics.scrape(client, f"http://127.0.0.1:{port}", {})
    finally:
        server.close()
        await server.wait_closed()
    assert s is not None and s.values == {"prompt": 7.0}
