"""The remote backend and the /metrics account on a real vLLM's answers, recorded byte
for byte (tests/fixtures/vllm/, re-recorded by tests/fixtures/record_vllm.py)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NotRequired, TypedDict

import httpx
import pytest

from phasechat.backends.base import RenderedPrompt
from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    Message,
    ServerAccount,
    StreamError,
    Usage,
)
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.server_metrics import CROWDED, Scrape, account, parse
from phasechat.backends.remote.servers import context_refusal
from phasechat.backends.remote.servers.vllm.render import render_on_vllm
from phasechat.backends.remote.token_text import byte_level, pieces_of, sentencepiece
from phasechat.chat.engine_held import parts_of
from phasechat.telemetry.anatomy import split_exact
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record

REQUEST = GenerationRequest((Message("user", "hi"),), max_tokens=100)


@pytest.fixture
def vllm_dir(fixtures_dir: Path) -> Path:
    return fixtures_dir.parent / "vllm"


def read(folder: Path, name: str) -> str:
    return (folder / name).read_text()


def value(page: str, name: str) -> float:
    """A metric's value in a page, read with a regular expression of its own (one label
    set: the recordings have one engine and one model)."""
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", page, re.M)
    assert m is not None, name
    return float(m.group(1))


class PromptDetails(TypedDict):
    cached_tokens: int


class UsageJson(TypedDict):
    """An OpenAI-style `usage` object as vLLM sends it."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: NotRequired[PromptDetails]  # with --enable-prompt-tokens-details


def usage_of(sse: str) -> UsageJson:
    for line in sse.splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return usage  # type: ignore[no-any-return]
    raise AssertionError("no usage")


def text_chunks(sse: str) -> int:
    return sum(
        bool(c.get("delta", {}).get("content"))
        for line in sse.splitlines()
        if line.startswith("data: {")
        for c in json.loads(line[6:]).get("choices", [])
    )


def server(
    folder: Path,
    stream: str,
    pages: list[str],
    status: int = 200,
    paths: list[str] | None = None,
    pace_s: float = 0.0,
) -> RemoteBackend:
    """A backend whose server answers /models with the recording, each /metrics read
    with the next of `pages` (then the last again), and the chat with `stream` (its first
    event after `pace_s`); each request's path goes into `paths`."""
    reads: Iterator[str] = iter(pages)

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if paths is not None:
            paths.append(path)
        if path.endswith("/models"):
            return httpx.Response(200, content=read(folder, "models.json"))
        if path.endswith("/metrics"):
            return httpx.Response(200, text=read(folder, next(reads, pages[-1])))
        ctype = "text/event-stream" if status == 200 else "application/json"
        return httpx.Response(status, headers={"content-type": ctype}, content=body())

    async def body() -> AsyncIterator[bytes]:  # an event per read, as a server sends it
        await asyncio.sleep(pace_s)
        for event in read(folder, stream).split("\n\n"):
            yield (event + "\n\n").encode()
            await asyncio.sleep(0.001)  # a server's pace: another stream may run meanwhile

    config = RemoteConfig(base_url="http://vllm.test/v1", model="smollm2")
    return RemoteBackend(config, transport=httpx.MockTransport(handler))


async def run(backend: RemoteBackend) -> tuple[list[Event], Trace]:
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    trace = Trace("openai", "smollm2", window=backend.context_window)
    events = [e async for e in record(backend.stream(REQUEST), trace)]
    await backend.aclose()
    return events, trace


async def test_the_window_is_max_model_len(vllm_dir: Path) -> None:
    backend = server(vllm_dir, "01-stop.sse", ["03-metrics-before.txt"])
    await backend.start()
    assert backend.context_window == 2048
    assert backend.metrics.enabled  # vLLM is known to have /metrics: it was read
    await backend.aclose()


async def test_a_stop_counts_the_end_of_sequence_token_it_sends_no_text_for(
    vllm_dir: Path,
) -> None:
    sse = read(vllm_dir, "01-stop.sse")
    # the recording itself: one counted token more than chunks with text
    assert usage_of(sse)["completion_tokens"] == text_chunks(sse) + 1
    backend = server(vllm_dir, "01-stop.sse", ["03-metrics-before.txt"] * 2)
    events, trace = await run(backend)
    last = events[-1]
    assert isinstance(last, Finished) and last.reason == "stop"
    assert last.t_silent_ns is not None and last.t_ns is not None
    assert trace.t_silent_token == last.t_silent_ns
    assert trace.t_last_token is not None and trace.t_silent_token >= trace.t_last_token


async def test_a_length_ends_on_a_token_with_text(vllm_dir: Path) -> None:
    sse = read(vllm_dir, "02-length.sse")
    assert usage_of(sse)["completion_tokens"] == text_chunks(sse) == 16
    events, _ = await run(server(vllm_dir, "02-length.sse", ["03-metrics-before.txt"] * 2))
    last = events[-1]
    assert isinstance(last, Finished) and last.reason == "length" and last.t_silent_ns is None


def test_cached_tokens_come_in_whole_blocks(vllm_dir: Path) -> None:
    cold = usage_of(read(vllm_dir, "03-cold.sse"))
    cached = usage_of(read(vllm_dir, "03-cached.sse"))
    page = read(vllm_dir, "03-metrics-after.txt")
    block = int(re.search(r'block_size="(\d+)"', page).group(1))  # type: ignore[union-attr]
    assert block == 32
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    # 199 prompt tokens: 6 whole blocks (192) are hit, the 7 of the part-filled one are not
    assert cached["prompt_tokens_details"]["cached_tokens"] == 192 == 199 // block * block


def test_the_pool_is_the_server_s_blocks_not_the_window(vllm_dir: Path) -> None:
    page = read(vllm_dir, "03-metrics-after.txt")
    blocks = int(re.search(r'num_gpu_blocks="(\d+)"', page).group(1))  # type: ignore[union-attr]
    scrape = parse(page)
    assert scrape is not None and scrape.engine == "vLLM"
    assert scrape.pool_tokens == blocks * 32 == 46_592 and scrape.block_tokens == 32


def test_the_account_of_one_request_is_the_difference_of_two_reads(vllm_dir: Path) -> None:
    before, after = read(vllm_dir, "03-metrics-before.txt"), read(vllm_dir, "03-metrics-after.txt")
    usage = usage_of(read(vllm_dir, "03-cached.sse"))
    a = account(parse(before), parse(after) or _fail(), Usage(199, usage["completion_tokens"]))

    def delta_ms(name: str) -> float:
        return (value(after, name) - value(before, name)) * 1000

    assert a.unknown is None and a.source == "vLLM /metrics"
    assert (a.prompt_tokens, a.cached_tokens, a.generated_tokens) == (199, 192, 17)
    assert a.prefill_ms == pytest.approx(delta_ms("vllm:request_prefill_time_seconds_sum"))
    assert a.decode_ms == pytest.approx(delta_ms("vllm:request_decode_time_seconds_sum"))
    assert a.queue_ms == pytest.approx(delta_ms("vllm:request_queue_time_seconds_sum"))
    assert a.ttft_ms == pytest.approx(delta_ms("vllm:time_to_first_token_seconds_sum"))
    assert a.pool_tokens == 46_592 and a.block_tokens == 32
    assert a.used_share == value(before, "vllm:kv_cache_usage_perc")


def test_overlapping_requests_have_no_account(vllm_dir: Path) -> None:
    before, after = read(vllm_dir, "06-overlap-before.txt"), read(vllm_dir, "06-overlap-after.txt")
    a = account(parse(before), parse(after) or _fail(), Usage(30, 14))
    assert a.unknown == "2 requests finished on the server meanwhile, not 1"
    assert (a.prefill_ms, a.decode_ms, a.prompt_tokens, a.cached_tokens) == (None,) * 4
    assert a.pool_tokens == 46_592  # the server's pool is known all the same


async def test_without_prompt_token_details_the_cache_comes_from_metrics(
    vllm_dir: Path,
) -> None:
    sse = read(vllm_dir, "07-no-details.sse")
    assert "prompt_tokens_details" not in sse  # vLLM's default: usage says nothing
    pages = ["07-metrics-before.txt", "07-metrics-after.txt"]
    # replayed as slowly as vLLM answered it: its account must fit in the request's time
    took = "vllm:e2e_request_latency_seconds_sum"
    pace = value(read(vllm_dir, pages[1]), took) - value(read(vllm_dir, pages[0]), took)
    events, trace = await run(server(vllm_dir, "07-no-details.sse", pages, pace_s=pace))
    (acct,) = [e for e in events if isinstance(e, ServerAccount)]
    assert acct.unknown is None
    m = compute(trace)
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_prompt_tokens) == (199, 192, 7)
    assert m.cache_reported and m.prefill_tok_s is not None
    assert m.server_source == "vLLM /metrics"
    before, after = read(vllm_dir, pages[0]), read(vllm_dir, pages[1])
    prefill_s = value(after, "vllm:request_prefill_time_seconds_sum") - value(
        before, "vllm:request_prefill_time_seconds_sum"
    )
    decode_s = value(after, "vllm:request_decode_time_seconds_sum") - value(
        before, "vllm:request_decode_time_seconds_sum"
    )
    assert m.server_prefill_tok_s == pytest.approx(7 / prefill_s)
    assert m.server_decode_tok_s == pytest.approx(16 / decode_s)  # 17 tokens, 16 steps
    # the request's KV in whole blocks (199 + 17 = 216 -> 7 blocks), apart from the pool
    assert m.kv_used_tokens == 224 and m.kv_capacity_tokens == 2048
    assert m.server_kv_pool_tokens == 46_592 and m.server_kv_block_tokens == 32


async def test_a_prompt_over_the_window_is_refused_with_its_sizes(vllm_dir: Path) -> None:
    body = read(vllm_dir, "04-too-long.json")
    assert context_refusal(body) == {"n_ctx": 2048, "n_prompt_tokens": 2049}
    events, _ = await run(server(vllm_dir, "04-too-long.json", ["03-metrics-before.txt"], 400))
    err = events[-1]
    assert isinstance(err, StreamError) and err.kind == "context_overflow"
    assert err.detail == {"n_ctx": 2048, "n_prompt_tokens": 2049}


def test_max_tokens_past_the_window_are_cut_to_it(vllm_dir: Path) -> None:
    # vLLM 0.32 does not refuse a prompt that fits with max_tokens that do not: the
    # answer stops at the window (2,021 + 27 = 2,048)
    usage = usage_of(read(vllm_dir, "05-clamped.sse"))
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 2048
    assert '"finish_reason":"length"' in read(vllm_dir, "05-clamped.sse")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("vllm:request_prefill_time_seconds_sum NaN", "not a number"),
        ("vllm:request_prefill_time_seconds_sum -5", "negative"),
        ("vllm:request_prefill_time_seconds_sum 1e999", "infinite"),
    ],
)
def test_a_figure_that_is_not_a_finite_count_is_dropped(line: str, why: str) -> None:
    page = f"vllm:num_requests_running 0\n{line}\n"
    scrape = parse(page)
    assert scrape is not None and scrape.get("prefill_s") is None, why


def test_counters_that_ran_backwards_give_no_figure() -> None:
    # a restarted server: its counters start again from zero
    before = parse("vllm:num_requests_running 0\nvllm:request_decode_time_seconds_sum 50\n")
    after = parse("vllm:num_requests_running 0\nvllm:request_decode_time_seconds_sum 0.4\n")
    assert before is not None and after is not None
    assert account(before, after, None).decode_ms is None


@pytest.mark.parametrize(
    "page",
    [
        "",
        "<html>not metrics</html>",
        "[" * 200_000,
        "process_cpu_seconds_total 3.2\n",  # a server we do not know
    ],
)
def test_a_page_of_no_server_we_know_is_none(page: str) -> None:
    assert parse(page) is None


def test_hostile_pool_labels_are_not_believed() -> None:
    big = "9" * 4000
    page = (
        "vllm:num_requests_running 0\n"
        f'vllm:cache_config_info{{block_size="{big}",num_gpu_blocks="٣٣"}} 1.0\n'
    )
    scrape = parse(page)
    assert scrape is not None and scrape.pool_tokens is None and scrape.block_tokens is None


def test_a_share_outside_zero_to_one_is_dropped() -> None:
    scrape = parse("vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 37\n")
    assert scrape is not None and scrape.get("used_share") is None


def _fail() -> Scrape:
    raise AssertionError("the page did not parse")


async def test_a_client_s_own_overlapping_requests_are_not_read_for(vllm_dir: Path) -> None:
    # a sweep's two streams at once: neither gets an account, the server is not read
    # after each (only once, by the last one out, for the next request's "before")
    paths: list[str] = []
    backend = server(vllm_dir, "01-stop.sse", ["03-metrics-before.txt"], paths=paths)
    await backend.start()

    async def one() -> list[Event]:
        return [e async for e in backend.stream(REQUEST)]

    first, second = await asyncio.gather(one(), one())
    await backend.aclose()
    for events in (first, second):
        (acct,) = [e for e in events if isinstance(e, ServerAccount)]
        assert acct.unknown == CROWDED and acct.prefill_ms is None
        assert acct.pool_tokens == 46_592  # the server's pool, from the last read
    assert paths.count("/metrics") == 2  # at the start, and once after both


def render_with(vllm_dir: Path, **hostile: object) -> RenderedPrompt | None:
    """vLLM's recorded /tokenize and /detokenize replies (08-*.json), the latter's
    fields replaced by `hostile`'s where given, through `render_on_vllm`."""
    tokenized = json.loads(read(vllm_dir, "08-tokenize.json"))
    detokenized = {**json.loads(read(vllm_dir, "08-detokenize.json")), **hostile}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            # asked as a chat request renders it, with each token's vocabulary string
            assert body["add_generation_prompt"] is True and body["return_token_strs"] is True
            return httpx.Response(200, json=tokenized)
        assert request.url.path == "/detokenize" and body == {"tokens": tokenized["tokens"]}
        return httpx.Response(200, json=detokenized)

    messages = (Message("system", "Be brief."), Message("user", "Héllo ☃ 😀"))

    async def go() -> RenderedPrompt | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await render_on_vllm(client, "http://vllm.test", {}, messages)

    return asyncio.run(go())


def test_vllm_s_tokens_are_read_as_bytes_that_spell_its_own_text(vllm_dir: Path) -> None:
    rendered = render_with(vllm_dir)
    assert rendered is not None and rendered.source == "server"
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHéllo ☃ 😀<|im_end|>\n"
    assert rendered.text == text + "<|im_start|>assistant\n"
    assert len(rendered.pieces) == 25  # the server's count
    # byte-level BPE: "Ġ" a space, "Ċ" a newline, "Ã©" the two bytes of "é", and the
    # snowman's three bytes over three tokens (" \xe2", "\x98", "\x83")
    assert rendered.pieces[2] == b"\n" and rendered.pieces[4] == b" brief"
    assert rendered.pieces[12] == "é".encode()
    assert rendered.pieces[14:17] == (b" \xe2", b"\x98", b"\x83")
    # the sections follow from them exactly: "é" is one token, not a count per character
    parts = parts_of((Message("system", "Be brief."), Message("user", "Héllo ☃ 😀")))
    a = split_exact(rendered.text, rendered.pieces, parts, None, None, "server")
    assert a is not None and [s.tokens for s in a.sections] == [3, 8, 14]


@pytest.mark.parametrize(
    "hostile",
    [
        {"prompt": "<|im_start|>system\nBe brief!"},  # not what the tokens spell
        {"prompt": None},
        {"prompt": 7},
    ],
)
def test_vllm_tokens_that_do_not_spell_its_own_text_give_no_rendering(
    vllm_dir: Path, hostile: dict[str, object]
) -> None:
    assert render_with(vllm_dir, **hostile) is None


def test_token_strings_in_either_spelling_are_read_as_their_bytes() -> None:
    assert byte_level(["Ġhi", "Ċ", "Ã©", "ĠðŁĺ", "Ģ"]) == (
        b" hi",
        b"\n",
        "é".encode(),
        b" \xf0\x9f\x98",
        b"\x80",
    )
    assert byte_level(["▁hi"]) is None  # "▁" is no byte-level character
    # SentencePiece: "▁" a space, "<0x0A>" one byte
    assert sentencepiece(["▁hi", "<0x0A>", "é"]) == (b" hi", b"\n", "é".encode())
    # which one: the one whose bytes spell the server's own text
    assert pieces_of(["▁hi", "<0x0A>"], " hi\n") == (b" hi", b"\n")
    assert pieces_of(["Ġhi", "Ċ"], " hi\n") == (b" hi", b"\n")
    assert pieces_of(["Ġhi", "Ċ"], " ho\n") is None
