"""A server's account of one request from two reads of its /metrics
(backends/server_metrics.py), on hand-written pages whose figures differ between the
reads and between label sets, so that reading the wrong one shows."""

from __future__ import annotations

import httpx
import pytest

from phasechat.backends.events import ServerAccount, Usage
from phasechat.backends.remote.server_metrics import (
    CROWDED,
    MetricsWatch,
    Scrape,
    Ticket,
    account,
    parse,
)
from phasechat.backends.remote.server_metrics import scrape as scrape_page
from tests.near import near

INFO = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",engine="0"} 1.0\n'


def vllm_page(
    running: float = 0,
    waiting: float = 0,
    finished: float = 5,
    prompt: float = 1000,
    cached: float = 400,
    generated: float = 500,
    used: float = 0.25,
    seconds: float = 10.0,
) -> str:
    """A vLLM page: two engines' counters (label sets) that add up to the figures given."""

    def two(name: str, total: float) -> str:
        return (
            f'{name}{{engine="0",model_name="m"}} {total * 0.75!r}\n'
            f'{name}{{engine="1",model_name="m"}} {total * 0.25!r}\n'
        )

    return (
        "# HELP vllm:num_requests_running Number of requests running.\n"
        + INFO
        + two("vllm:num_requests_running", running)
        + two("vllm:num_requests_waiting", waiting)
        + two("vllm:e2e_request_latency_seconds_count", finished)
        + two("vllm:prompt_tokens_total", prompt)
        + two("vllm:prompt_tokens_cached_total", cached)
        + two("vllm:generation_tokens_total", generated)
        + two("vllm:request_prefill_time_seconds_sum", seconds)
        + two("vllm:request_decode_time_seconds_sum", seconds * 2)
        + two("vllm:request_queue_time_seconds_sum", seconds / 4)
        + two("vllm:time_to_first_token_seconds_sum", seconds / 2)
        + f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {used!r}\n'
    )


def scrape(**figures: float) -> Scrape:
    got = parse(vllm_page(**figures))
    assert got is not None
    return got


def test_a_metric_under_several_label_sets_is_their_sum() -> None:
    s = scrape(prompt=1000, generated=500, finished=5)
    assert s.engine == "vLLM"
    assert s.values == {
        "running": 0.0,
        "finished": 5.0,
        "prompt": 1000.0,
        "cached": 400.0,
        "generated": 500.0,
        "prefill_s": 10.0,
        "decode_s": 20.0,
        "queue_s": 2.5,
        "ttft_s": 5.0,
        "used_share": 0.25,
    }
    assert (s.pool_tokens, s.block_tokens) == (16_000, 16)


def test_the_account_is_the_difference_of_the_sums_and_the_pool_fill_at_the_send() -> None:
    before = scrape(used=0.25)
    after = scrape(
        finished=6, prompt=1300, cached=528, generated=520, used=0.75, seconds=10.4
    )  # the request: 300 prompt tokens, 128 of them cached, 20 generated
    got = account(before, after, Usage(300, 20))
    assert got == ServerAccount(
        source="vLLM /metrics",
        prompt_tokens=300,
        cached_tokens=128,
        generated_tokens=20,
        prefill_ms=near(400.0),
        decode_ms=near(800.0),
        queue_ms=near(100.0),
        ttft_ms=near(200.0),
        pool_tokens=16_000,
        block_tokens=16,
        used_share=0.25,  # when it was sent, not 0.75 after it
        unknown=None,
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"running": 1}, {}),  # another request ran at the first read only
        ({}, {"running": 1}),  # ... at the second only
        ({"waiting": 1}, {}),  # one waited at the first read
        ({"running": 1}, {"running": 1}),
    ],
)
def test_another_request_at_either_read_leaves_the_account_unknown(
    before: dict[str, float], after: dict[str, float]
) -> None:
    got = account(scrape(**before), scrape(finished=6, generated=520, **after), Usage(300, 20))
    assert got.unknown == "other requests ran on the server at the same time"
    assert (got.prompt_tokens, got.generated_tokens, got.prefill_ms) == (None, None, None)
    assert (got.pool_tokens, got.block_tokens, got.used_share) == (16_000, 16, 0.25)


def test_the_count_of_finished_requests_and_of_tokens_must_be_this_requests() -> None:
    before = scrape()
    two = account(before, scrape(finished=7, generated=520), Usage(300, 20))
    assert two.unknown == "2 requests finished on the server meanwhile, not 1"
    more = account(before, scrape(finished=6, generated=530), Usage(300, 20))
    assert more.unknown == (
        "the server generated 30 tokens meanwhile, this answer 20: "
        "other requests ran at the same time"
    )
    # fewer than the answer's own: no crowd explains that, the counts disagree
    fewer = account(before, scrape(finished=6, generated=509), Usage(300, 20))
    assert fewer.unknown == (
        "mismatch: the server's /metrics counted 9 generated tokens, its usage 20 for this answer"
    )
    assert account(None, before, None).unknown == "no earlier read of /metrics to compare with"


def test_llama_server_counts_its_cached_prompt_tokens_apart() -> None:
    def page(prompt: float, cached: float, generated: float, seconds: float) -> Scrape:
        got = parse(
            "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
            f"llamacpp:prompt_tokens_total {prompt}\n"
            f"llamacpp:prompt_tokens_cached_total {cached}\n"
            f"llamacpp:tokens_predicted_total {generated}\n"
            f"llamacpp:prompt_seconds_total {seconds}\n"
            f"llamacpp:tokens_predicted_seconds_total {seconds * 3}\n"
        )
        assert got is not None and got.engine == "llama-server"
        return got

    # 50 evaluated and 30 cached: a prompt of 80
    got = account(page(100, 10, 40, 1.0), page(150, 40, 52, 1.5), Usage(80, 12))
    assert (got.prompt_tokens, got.cached_tokens, got.generated_tokens) == (80, 30, 12)
    assert got.prefill_ms == pytest.approx(500.0) and got.decode_ms == pytest.approx(1500.0)
    assert (got.queue_ms, got.ttft_ms, got.pool_tokens, got.used_share) == (None,) * 4
    assert got.source == "llama-server /metrics"


def test_a_request_the_server_has_not_counted_yet_has_no_account() -> None:
    # the finished count did not move: the figures are not this request's (yet)
    got = account(scrape(), scrape(generated=520), Usage(300, 20))
    assert got.unknown == "0 requests finished on the server meanwhile, not 1"


@pytest.mark.parametrize(("share", "kept"), [(0.0, 0.0), (1.0, 1.0), (1.5, None)])
def test_a_pool_fill_from_empty_to_full_is_believed(share: float, kept: float | None) -> None:
    assert scrape(used=share).get("used_share") == kept


class Pages:
    """A server whose /metrics answers each of `pages` in turn (the last one again)."""

    def __init__(self, *pages: str) -> None:
        self.pages, self.reads = list(pages), 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        page = self.pages[min(self.reads, len(self.pages) - 1)]
        self.reads += 1
        return httpx.Response(200, text=page)


async def test_the_account_waits_for_the_server_to_count_the_request() -> None:
    # read before; then after the answer, once before vLLM counted it (nothing moved),
    # then counted: the account is the difference with the counted read
    pages = Pages(
        vllm_page(),
        vllm_page(),
        vllm_page(finished=6, prompt=1300, cached=528, generated=520, seconds=10.4),
    )
    watch = MetricsWatch()
    async with httpx.AsyncClient(transport=httpx.MockTransport(pages.handle)) as client:
        await watch.start(client, "http://h", {})
        assert watch.enabled
        ticket = watch.begin()
        assert ticket == Ticket(1, True) and watch.alone(ticket)
        got = await watch.finished(ticket, client, "http://h", {}, Usage(300, 20))
        watch.end()
    assert pages.reads == 3
    assert got is not None and got.unknown is None
    assert (got.prompt_tokens, got.cached_tokens, got.generated_tokens) == (300, 128, 20)
    assert got.prefill_ms == pytest.approx(400.0)
    assert watch.last is not None and watch.last.get("finished") == 6.0  # the next "before"


async def test_requests_of_one_client_at_once_have_no_account_and_one_read() -> None:
    pages = Pages(vllm_page(), vllm_page(finished=7))
    watch = MetricsWatch()
    async with httpx.AsyncClient(transport=httpx.MockTransport(pages.handle)) as client:
        await watch.start(client, "http://h", {})
        first, second = watch.begin(), watch.begin()
        assert (first, second) == (Ticket(1, True), Ticket(2, False))
        assert not watch.alone(first) and not watch.alone(second)
        a = await watch.finished(first, client, "http://h", {}, None)  # not the last out
        watch.end()
        b = await watch.finished(second, client, "http://h", {}, None)  # the last: reads
        watch.end()
    assert pages.reads == 2  # the start, and once by the last one out
    for got in (a, b):
        assert got == ServerAccount(
            "vLLM /metrics", pool_tokens=16_000, block_tokens=16, unknown=CROWDED
        )
    assert watch.last is not None and watch.last.get("finished") == 7.0


@pytest.mark.parametrize(
    ("labels", "pool", "block"),
    [
        ('block_size="16",num_gpu_blocks="1000"', 16_000, 16),
        ('block_size="16",num_gpu_blocks="0"', None, 16),  # no blocks: no pool
        ('block_size="16.5",num_gpu_blocks="1000"', None, None),  # not a whole number
        ('block_size="16",num_gpu_blocks="1234567890123"', None, 16),  # 13 digits
        ('block_size="65536",num_gpu_blocks="65536"', 1 << 32, 65536),  # the largest believed
        ('block_size="65536",num_gpu_blocks="65537"', None, 65536),
        ('kv_cache_size_tokens="5000"', 5000, None),  # the size itself, without blocks
    ],
)
def test_the_pool_is_blocks_times_their_size_within_bounds(
    labels: str, pool: int | None, block: int | None
) -> None:
    s = parse(f"vllm:cache_config_info{{{labels}}} 1.0\nvllm:num_requests_running 0\n")
    assert s is not None and (s.pool_tokens, s.block_tokens) == (pool, block)


def test_a_figure_that_is_no_count_is_left_out_and_older_vllm_counts_cache_hits() -> None:
    s = parse(
        "vllm:num_requests_running 0\n"
        "vllm:prompt_tokens_total -5\n"  # negative: not believed
        "vllm:generation_tokens_total NaN\n"
        "vllm:request_prefill_time_seconds_sum +Inf\n"
        'vllm:prefix_cache_hits_total{engine="0"} 96\n'  # before prompt_tokens_cached
        "not a metric line\n"
    )
    assert s is not None and s.values == {"running": 0.0, "cached": 96.0}
    assert parse("process_cpu_seconds_total 3\n") is None  # no server we know
    llama = parse("llamacpp:prompt_tokens_total 10\n")
    assert llama is not None and llama.engine == "llama-server" and llama.values == {"prompt": 10.0}


async def test_a_scrape_that_fails_is_none() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="vllm:num_requests_running 0\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        assert await scrape_page(client, "http://h", {}) is None
        watch = MetricsWatch()
        await watch.start(client, "http://h", {})
        assert (watch.enabled, watch.last) == (False, None)


def test_counts_are_rounded_and_a_whole_prompt_cached_is_believed() -> None:
    # float sums of counters land a hair off a whole number: 299.9999999 is 300 tokens
    before = scrape()
    after = scrape(finished=6, prompt=1299.9999999, cached=700, generated=520)
    got = account(before, after, Usage(300, 20))
    # all 300 prompt tokens cached (a prompt read before, whole): believed, not dropped
    assert (got.prompt_tokens, got.cached_tokens, got.generated_tokens) == (300, 300, 20)
    more = account(before, scrape(finished=6, prompt=1300, cached=701, generated=520), None)
    assert (more.prompt_tokens, more.cached_tokens) == (300, None)  # more cached than read


def test_a_request_of_hours_is_still_measured_and_one_over_a_day_is_not() -> None:
    # a 2-hour decode (7,200 s): 7.2 million ms; a day or more is a restarted counter
    long = account(scrape(), scrape(finished=6, generated=520, seconds=3610.0), Usage(300, 20))
    assert long.decode_ms == pytest.approx(2 * 3600.0 * 1000)  # decode runs at 2 x seconds
    assert long.prefill_ms == pytest.approx(3600.0 * 1000)
    day = account(scrape(), scrape(finished=6, generated=520, seconds=86_420.0), Usage(300, 20))
    assert day.prefill_ms is None and day.decode_ms is None  # 86,410 s and 172,820 s
    assert day.queue_ms == pytest.approx((86_420.0 - 10.0) / 4 * 1000)  # 6 hours: kept
