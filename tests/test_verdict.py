"""The verdict (telemetry/verdict.py), the bandwidth probe and its cache (chat/roofline.py),
and where a user meets them: `ask --stats` and `doctor`, on the real bundled model."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from phasechat.backends.local.gguf import geometry
from phasechat.backends.local.models import default_model_path
from phasechat.chat import roofline
from phasechat.chat.roofline import (
    cached_bandwidth,
    largest_context,
    machine_bandwidth,
    machine_key,
    mem_available,
)
from phasechat.telemetry import membw
from phasechat.telemetry.membw import Probed, probe_bandwidth
from phasechat.telemetry.metrics import Metrics, metrics_from_dict
from phasechat.telemetry.verdict import (
    KNOBS,
    engine_says,
    knob,
    phase_shares,
    stats_line,
    transport,
    verdict,
)


def metrics(**fields: Any) -> Metrics:
    base = {
        "backend": "local",
        "model": "m",
        "finish": "stop",
        "ttft_ms": 100.0,
        "e2e_ms": 1000.0,
        "prompt_tokens": 400,
        "cached_tokens": 300,
        "evaluated_prompt_tokens": 100,
        "output_tokens": 64,
        "decode_tok_s": 70.0,
        "prefill_tok_s": 1000.0,
    }
    return metrics_from_dict({**base, **fields})


def test_decode_bound_names_weights_and_max_tokens() -> None:
    v = verdict(metrics(implied_bandwidth_gb_s=5.0), bandwidth_gb_s=20.0)
    assert v is not None
    assert v.phase == "decode"
    assert [(name, round(share, 2)) for name, share in v.shares] == [
        ("decode", 0.9),
        ("prefill", 0.1),
    ]
    assert "quantized weights" in v.knob and "max_tokens" in v.knob
    assert v.roofline == "decode runs at 25% of what memory allows (5.0 of 20.0 GB/s)"
    assert v.line().startswith("decode-bound (decode 90% · prefill 10%): try smaller")


def test_an_answer_cut_at_max_tokens_says_so_first() -> None:
    v = verdict(metrics(finish="length"))
    assert v is not None and v.knob.startswith("a lower max_tokens (the answer stopped at it)")


def test_prefill_bound_with_a_cold_cache_names_the_cache() -> None:
    cold = verdict(metrics(ttft_ms=700.0, cached_tokens=20))
    assert cold is not None and cold.phase == "prefill"
    assert cold.knob.startswith("a stable prefix the engine can cache (20 of 400")
    warm = verdict(metrics(ttft_ms=700.0, cached_tokens=380))
    assert warm is not None and warm.knob.startswith("a shorter prompt")


def test_thinking_is_its_own_phase() -> None:
    m = metrics(ttft_ms=100.0, reasoning_ms=600.0, reasoning_tokens=50, e2e_ms=1000.0)
    shares = phase_shares(m)
    assert shares is not None
    assert [(n, round(s, 2)) for n, s in shares] == [
        ("thinking", 0.6),
        ("decode", 0.3),
        ("prefill", 0.1),
    ]
    v = verdict(m)
    assert v is not None and v.phase == "thinking" and "reasoning effort" in v.knob


def test_a_thinking_span_with_no_thinking_tokens_is_not_a_phase() -> None:
    # a server that says reasoning_tokens: 0 did not think, whatever span was measured
    m = metrics(ttft_ms=100.0, reasoning_ms=600.0, reasoning_tokens=0, e2e_ms=1000.0)
    assert phase_shares(m) == (("decode", 0.9), ("prefill", 0.1))


def test_the_cache_is_named_below_half_the_prompt_cached_not_at_half() -> None:
    half = verdict(metrics(ttft_ms=700.0, cached_tokens=200))  # 200 of 400: exactly 50%
    assert half is not None and half.phase == "prefill" and half.knob == KNOBS["prefill"]
    below = verdict(metrics(ttft_ms=700.0, cached_tokens=199))
    assert below is not None and below.knob.startswith("a stable prefix the engine can cache (199")


def test_roofline_unknown_says_why() -> None:
    remote = verdict(metrics(backend="openai"), bandwidth_gb_s=20.0)
    assert remote is not None
    assert remote.roofline == "roofline unknown: the weights' size is not known for this backend"
    unmeasured = verdict(metrics(implied_bandwidth_gb_s=5.0), bandwidth_gb_s=None)
    assert unmeasured is not None and "bandwidth is not measured" in unmeasured.roofline
    assert verdict(metrics(ttft_ms=None)) is None  # failed before its first token


def test_stats_line() -> None:
    line = stats_line(metrics(e2e_ms=1234.5))
    assert line == (
        "ttft 100 ms · prompt 400 tokens (300 cached, 100 evaluated) · prefill 1,000.0 tok/s"
        " · decode 70.0 tok/s (64 tokens) · e2e 1,234 ms"
    )
    remote = stats_line(metrics(cached_tokens=None, evaluated_prompt_tokens=None))
    assert "(cache unknown)" in remote


def fake_perf_counter(durations: list[float]) -> SimpleNamespace:
    """A `time` whose perf_counter reads 0, d0, 1, 1 + d1, 2, 2 + d2, ...: each round of the
    probe, timed between two reads, takes exactly its duration."""
    reads = iter([t for i, d in enumerate(durations) for t in (float(i), i + d)])
    return SimpleNamespace(perf_counter=lambda: next(reads))


def test_the_probe_is_two_bytes_per_byte_copied_over_the_fastest_round_all_threads_summed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # durations that are exact in binary: 1/256, 1/512 (the fastest), 3/1024 s
    monkeypatch.setattr(membw, "time", fake_perf_counter([1 / 256, 1 / 512, 3 / 1024]))
    # two threads, each copying half of 1 MiB, timed together: 1 MiB read and 1 MiB
    # written in 1/512 s, 2 x 2^20 x 512 bytes/s
    probed = probe_bandwidth(size=2**20, rounds=3, threads=2, min_s=0)
    assert probed.gb_s == 2 * 2**20 * 512 / 1e9 == 1.073741824
    assert probed.threads == 2


def test_a_probed_bandwidth_is_cached_with_its_own_figure_time_threads_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(roofline, "time", SimpleNamespace(time=lambda: 1_750_000_000.5))
    path = tmp_path / "bandwidth.json"
    first = machine_bandwidth(path, lambda: Probed(36.5, 4, 0.03))
    assert (first.gb_s, first.measured_at, first.cached) == (36.5, 1_750_000_000.5, False)
    entry = json.loads(path.read_text())[machine_key()]
    assert entry == {"gb_s": 36.5, "measured_at": 1_750_000_000.5, "threads": 4, "others": 0.03}
    again = machine_bandwidth(path, lambda: pytest.fail("probed again"))
    assert (again.gb_s, again.measured_at, again.cached) == (36.5, 1_750_000_000.5, True)
    assert (again.threads, again.others) == (4, 0.03)


def test_bandwidth_is_probed_once_then_read_from_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "bandwidth.json"
    calls: list[int] = []

    def probe() -> Probed:
        calls.append(1)
        return Probed(12.5, 2, 0.0)

    first = machine_bandwidth(path, probe)
    assert (first.gb_s, first.cached, len(calls)) == (12.5, False, 1)
    assert json.loads(path.read_text())[machine_key()]["gb_s"] == 12.5
    again = machine_bandwidth(path, probe)
    assert (again.gb_s, again.cached, len(calls)) == (12.5, True, 1)
    path.write_text("not json")
    assert cached_bandwidth(path) is None
    assert machine_bandwidth(path, probe).gb_s == 12.5 and len(calls) == 2
    blocked = tmp_path / "file"
    blocked.write_text("")
    # a cache that cannot be written: still measured, only not kept
    assert machine_bandwidth(blocked / "bandwidth.json", probe).cached is False


def test_the_real_probe_runs_and_refuses_nonsense() -> None:
    # the figure itself is checked with a fake clock above; this one runs the real copy
    probed = probe_bandwidth(size=4 * 2**20, rounds=2, min_s=0)
    assert probed.gb_s > 0 and probed.threads == membw.probe_threads() >= 1
    with pytest.raises(ValueError, match="positive"):
        probe_bandwidth(size=0)


def test_mem_available_and_the_largest_context(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  8000000 kB\nMemAvailable:    2097152 kB\n")
    assert mem_available(meminfo) == 2 * 2**30
    assert mem_available(tmp_path / "none") is None
    g = geometry(default_model_path())
    weights = g.file_bytes
    fits = largest_context(g, weights, 2 * 2**30)
    assert weights + g.kv_bytes(fits, fits) <= 2 * 2**30 < weights + g.kv_bytes(fits + 1, fits + 1)
    assert largest_context(g, weights, weights // 2) == 0


def phasechat(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", *args], capture_output=True, text=True, timeout=180
    )


@pytest.mark.model
def test_ask_stats_prints_figures_and_verdict_on_stderr() -> None:
    r = phasechat("ask", "--stats", "--no-save", "--max-tokens", "16", "--temperature", "0", "Hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "ttft" not in r.stdout  # stdout is the answer alone
    figures, engine, judged = r.stderr.strip().splitlines()
    assert figures.startswith("ttft ") and "cached" in figures and "evaluated" in figures
    # llama.cpp's own counters beside ours, labelled
    assert engine.startswith("llama.cpp says prefill ") and " · decode " in engine
    assert "decode" in figures and "e2e" in figures
    assert "-bound (" in judged and "try " in judged
    # the local model knows its weights: the roofline is drawn against this machine
    assert "of what memory allows" in judged and "GB/s" in judged


@pytest.mark.model
def test_doctor_shows_bandwidth_and_the_largest_context() -> None:
    first = phasechat("doctor")
    assert first.returncode == 0, first.stderr
    (line,) = [x for x in first.stdout.splitlines() if x.startswith("memory bandwidth")]
    assert "GB/s" in line and "of the CPUs" in line  # the load beside the probe
    assert "all cores, summed" in line or "one core" in line  # which copy it measured
    assert "largest context" in first.stdout and "MemAvailable" in first.stdout


def test_a_remote_answer_splits_its_ttft_between_the_server_and_the_transport() -> None:
    base = {"backend": "openai", "model": "m", "ttft_ms": 400.0, "e2e_ms": 500.0}
    with_server = metrics_from_dict({**base, "headers_ms": 20.0, "server_prompt_ms": 100.0})
    judged = verdict(with_server)
    assert judged is not None
    assert judged.transport == (
        "TTFT 400 ms: the server's prefill 100 ms, the transport and its queue 300 ms (75%)"
    )
    assert judged.line().endswith(judged.transport)
    without = metrics_from_dict({**base, "headers_ms": 350.0, "connect_ms": 2.0})
    assert transport(without) == (
        "TTFT 400 ms: connect 2 ms, headers at 350 ms "
        "(the server does not say its own prefill time)"
    )
    assert transport(metrics_from_dict(base)) == ""  # local: no request of its own


def test_vllm_s_own_account_is_labelled_and_splits_the_ttft() -> None:
    m = metrics_from_dict(
        {
            "backend": "openai",
            "model": "m",
            "ttft_ms": 420.0,
            "e2e_ms": 900.0,
            "headers_ms": 15.0,
            "server_source": "vLLM /metrics",
            "server_prompt_n": 7,
            "server_cache_n": 192,
            "server_prompt_ms": 350.0,
            "server_prefill_tok_s": 20.0,
            "server_predicted_ms": 400.0,
            "server_decode_tok_s": 40.0,
            "server_ttft_ms": 380.0,
            "server_queue_ms": 2.0,
            "transport_ms": 40.0,
            "server_kv_pool_tokens": 46592,
            "server_kv_used_share": 0.03,
            "server_kv_block_tokens": 32,
        }
    )
    assert engine_says(m) == (
        "vLLM /metrics says prefill 20.0 tok/s (7 tok, 192 cached) · decode 40.0 tok/s"
        " · queue 2 ms · KV pool 46,592 tokens, 3% full at the send, blocks of 32"
    )
    assert transport(m) == (
        "TTFT 420 ms: the server's own 380 ms (queue 2 ms, prefill 350 ms), "
        "the transport 40 ms (10%)"
    )
    # a server that defines its parts otherwise has them under its own names (Dynamo:
    # its frontend's tokenizing and routing, its worker's queue and prefill together)
    named = replace(
        m,
        server=replace(
            m.server,
            server_queue_name="frontend: tokenize + route",
            server_prefill_name="worker: queue + prefill",
        ),
    )
    assert transport(named) == (
        "TTFT 420 ms: the server's own 380 ms (frontend: tokenize + route 2 ms, "
        "worker: queue + prefill 350 ms), the transport 40 ms (10%)"
    )
    # without its own time to first token (longer than ours: not believed)
    assert transport(
        replace(named, server=replace(named.server, server_ttft_ms=None, transport_ms=None))
    ) == ("TTFT 420 ms: the server's worker: queue + prefill 350 ms, the rest 70 ms (17%)")
    overlapped = metrics_from_dict(
        {"backend": "openai", "model": "m", "server_source": None,
         "server_unknown": "other requests ran on the server at the same time"}
    )  # fmt: skip
    assert engine_says(overlapped) == (
        "the server: this request's own figures unknown "
        "(other requests ran on the server at the same time)"
    )


def test_a_prompt_shorter_than_one_block_is_not_told_to_keep_a_stable_prefix() -> None:
    base = {"backend": "openai", "model": "m", "ttft_ms": 900.0, "e2e_ms": 1000.0}
    short = metrics_from_dict({**base, "prompt_tokens": 20, "cached_tokens": 0,
                               "server_kv_block_tokens": 32})  # fmt: skip
    assert knob("prefill", short) == (
        "a shorter prompt: this server caches whole blocks of 32 tokens, and a 20-token "
        "prompt fills none, so a stable prefix cannot help"
    )
    # one block and more: the prefix advice stands
    longer = metrics_from_dict({**base, "prompt_tokens": 40, "cached_tokens": 0,
                                "server_kv_block_tokens": 32})  # fmt: skip
    assert knob("prefill", longer).startswith("a stable prefix the engine can cache (0 of 40")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # a TTFT past the e2e (clocks read apart): prefill is the whole wall time, not more
        ({"ttft_ms": 1200.0}, (("prefill", 1.0), ("decode", 0.0))),
        # a thinking span longer than what is left after the TTFT: cut to the rest
        (
            {"ttft_ms": 100.0, "reasoning_ms": 950.0, "reasoning_tokens": 9},
            (("thinking", 0.9), ("prefill", 0.1), ("decode", 0.0)),
        ),
        # prefill and decode tied: prefill stays first (the order the phases are listed)
        ({"ttft_ms": 500.0}, (("prefill", 0.5), ("decode", 0.5))),
        # distinct shares, prefill largest: largest first, not smallest
        ({"ttft_ms": 750.0}, (("prefill", 0.75), ("decode", 0.25))),
        # no reasoning span: no thinking phase however many thinking tokens
        ({"reasoning_tokens": 9}, (("decode", 0.9), ("prefill", 0.1))),
        # a zero or negative e2e has no shares
        # a thinking span of zero, or negative (clocks apart): no thinking phase
        ({"reasoning_ms": 0.0, "reasoning_tokens": 9}, (("decode", 0.9), ("prefill", 0.1))),
        ({"reasoning_ms": -50.0, "reasoning_tokens": 9}, (("decode", 0.9), ("prefill", 0.1))),
        # a sub-millisecond answer still has shares
        ({"ttft_ms": 0.125, "e2e_ms": 0.5}, (("decode", 0.75), ("prefill", 0.25))),
        ({"e2e_ms": 0.0}, None),
        ({"e2e_ms": -5.0}, None),
        ({"ttft_ms": None}, None),
    ],
)
def test_phase_shares_split_the_wall_time_largest_first_clamped_to_it(
    fields: dict[str, Any], expected: tuple[tuple[str, float], ...] | None
) -> None:
    shares = phase_shares(metrics(**fields))
    if expected is None:
        assert shares is None
        return
    assert shares is not None
    assert [(n, round(s, 6)) for n, s in shares] == list(expected)


@pytest.mark.parametrize(
    ("bandwidth", "label", "expected"),
    [
        (20.0, "", "decode runs at 25% of what memory allows (5.0 of 20.0 GB/s)"),
        (
            8.0,
            "probed on a busy machine",
            "decode runs at 62% of what memory allows (5.0 of 8.0 GB/s, probed on a busy machine)",
        ),
        (0.5, "", "decode runs at 1000% of what memory allows (5.0 of 0.5 GB/s)"),
        (0.0, "", "roofline unknown: this machine's memory bandwidth is not measured"),
        (-3.0, "", "roofline unknown: this machine's memory bandwidth is not measured"),
        (float("inf"), "", "roofline unknown: this machine's memory bandwidth is not measured"),
        (float("nan"), "", "roofline unknown: this machine's memory bandwidth is not measured"),
    ],
)
def test_the_roofline_is_implied_over_measured_and_refuses_a_nonsense_bandwidth(
    bandwidth: float, label: str, expected: str
) -> None:
    v = verdict(metrics(implied_bandwidth_gb_s=5.0), bandwidth, label)
    assert v is not None and v.roofline == expected


def test_the_roofline_without_a_decode_rate_says_so() -> None:
    v = verdict(metrics(decode_tok_s=None), 20.0)
    assert v is not None and v.roofline == "roofline: no decode rate (fewer than two tokens)"
    v = verdict(metrics(decode_tok_s=None, decode_unknown="300 tokens arrived within"), 20.0)
    assert v is not None and v.roofline == "roofline: no decode rate (the tokens came in a burst)"


def test_a_prompt_of_exactly_one_block_keeps_the_prefix_advice() -> None:
    base = {"backend": "openai", "model": "m", "ttft_ms": 900.0, "e2e_ms": 1000.0}
    one = metrics_from_dict({**base, "prompt_tokens": 32, "cached_tokens": 0,
                             "server_kv_block_tokens": 32})  # fmt: skip
    assert knob("prefill", one).startswith("a stable prefix the engine can cache (0 of 32")
    below = metrics_from_dict({**base, "prompt_tokens": 31, "cached_tokens": 0,
                               "server_kv_block_tokens": 32})  # fmt: skip
    assert knob("prefill", below).startswith("a shorter prompt: this server caches whole blocks")
    # a cut answer with decode or thinking the largest phase; prefill is not told so
    cut = metrics(finish="length")
    assert knob("thinking", cut) == (
        "a lower max_tokens (the answer stopped at it), less thinking (a lower reasoning "
        "effort or a non-thinking mode)"
    )
    assert knob("decode", cut) == (
        "a lower max_tokens (the answer stopped at it), smaller or more quantized weights"
    )
    assert knob("prefill", metrics(finish="length", cached_tokens=400)) == KNOBS["prefill"]
    assert knob("decode", metrics()) == KNOBS["decode"]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # the server's prefill exactly the TTFT: nothing left for the transport
        (
            {"server_prompt_ms": 400.0},
            "TTFT 400 ms: the server's prefill 400 ms, the transport and its queue 0 ms (0%)",
        ),
        # the server's prefill past our TTFT (clocks apart): its figures are not split
        (
            {"server_prompt_ms": 401.0, "connect_ms": 0.0},
            "TTFT 400 ms: headers at 20 ms (the server does not say its own prefill time)",
        ),
        # vLLM: no queue figure, no prefill figure; the transport's share of the TTFT
        (
            {"server_ttft_ms": 300.0, "transport_ms": 100.0},
            "TTFT 400 ms: the server's own 300 ms (prefill unknown), the transport 100 ms (25%)",
        ),
        # the server's TTFT without the transport's: not vLLM's split
        (
            {"server_ttft_ms": 300.0},
            "TTFT 400 ms: headers at 20 ms (the server does not say its own prefill time)",
        ),
        # a sub-millisecond TTFT is still split
        (
            {"ttft_ms": 0.5, "headers_ms": 0.25},
            "TTFT 0 ms: headers at 0 ms (the server does not say its own prefill time)",
        ),
        ({"ttft_ms": 0.0}, ""),
        ({"ttft_ms": -1.0}, ""),
    ],
)
def test_the_ttft_split_at_its_edges(fields: dict[str, Any], expected: str) -> None:
    base = {"backend": "openai", "model": "m", "ttft_ms": 400.0, "e2e_ms": 500.0}
    assert transport(metrics_from_dict({**base, "headers_ms": 20.0, **fields})) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"server_source": "llama.cpp", "server_prompt_ms": 10.0, "server_prompt_n": 5,
             "server_cache_n": 0, "server_prefill_tok_s": 500.0, "server_decode_tok_s": 40.25},
            "llama.cpp says prefill 500.0 tok/s (5 tok) · decode 40.2 tok/s",
        ),
        (
            {"server_source": "timings", "server_predicted_ms": 10.0, "server_prompt_n": 5,
             "server_cache_n": 3, "server_queue_ms": 0.0},
            "the server says prefill - tok/s (5 tok, 3 cached) · decode - tok/s · queue 0 ms",
        ),
        (
            {"server_kv_pool_tokens": 1000},
            "KV pool 1,000 tokens",
        ),
        (
            {"server_kv_pool_tokens": 1000, "server_kv_used_share": 0.0},
            "KV pool 1,000 tokens, 0% full at the send",
        ),
        ({"server_kv_pool_tokens": 0, "server_kv_block_tokens": 16}, ""),
    ],
)  # fmt: skip
def test_the_engine_s_account_names_its_source_and_leaves_out_what_it_did_not_say(
    fields: dict[str, Any], expected: str
) -> None:
    assert engine_says(metrics_from_dict({"backend": "openai", "model": "m", **fields})) == expected


@pytest.mark.parametrize(("cpus", "expected"), [(set(), 1), ({0}, 1), ({0, 1, 2}, 3)])
def test_the_probe_copies_with_one_thread_per_cpu_it_may_run_on_at_least_one(
    monkeypatch: pytest.MonkeyPatch, cpus: set[int], expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    assert membw.probe_threads() == expected


@pytest.mark.parametrize(("count", "expected"), [(None, 1), (1, 1), (4, 4)])
def test_without_an_affinity_the_probe_counts_the_cpus(
    monkeypatch: pytest.MonkeyPatch, count: int | None, expected: int
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    assert membw.probe_threads() == expected


@pytest.mark.parametrize(
    ("size", "threads", "copied"),
    [
        (1, 1, 1),  # the smallest probe
        (1, 2, 2),  # fewer bytes than threads: each still copies one
        (3, 2, 2),  # 3 bytes in two threads: a byte each, the odd one left out
        (1000, 4, 1000),
    ],
)
def test_the_rate_counts_the_bytes_each_thread_copied_read_and_written(
    monkeypatch: pytest.MonkeyPatch, size: int, threads: int, copied: int
) -> None:
    # two rounds, the second the fastest: 1/1024 s; no more rounds than asked (min_s 0)
    monkeypatch.setattr(membw, "time", fake_perf_counter([1 / 256, 1 / 1024]))
    assert membw.copy_rate(size, 2, threads) == 2 * copied * 1024 / 1e9


def test_the_probe_stops_at_max_rounds_however_long_min_s_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the 400th round is the fastest; a 401st would read past the fake clock
    durations = [1 / 64] * (membw.MAX_ROUNDS - 1) + [1 / 128]
    monkeypatch.setattr(membw, "time", fake_perf_counter(durations))
    assert membw.MAX_ROUNDS == 400
    assert membw.copy_rate(16, 1, 1, min_s=1e9) == 2 * 16 * 128 / 1e9


@pytest.mark.parametrize(("size", "rounds"), [(0, 1), (1, 0), (-1, 1), (1, -1)])
def test_the_probe_refuses_no_bytes_or_no_rounds(size: int, rounds: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        probe_bandwidth(size=size, rounds=rounds, min_s=0)


def test_every_round_waits_for_every_thread_s_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    copies: list[int] = []
    fake = SimpleNamespace(
        create_string_buffer=ctypes.create_string_buffer,
        memset=ctypes.memset,
        memmove=lambda dst, src, n: copies.append(n),
        Array=ctypes.Array,
    )
    monkeypatch.setattr(membw, "ctypes", fake)
    membw.copy_rate(64, 5, 4)
    assert copies == [16] * 20


@pytest.mark.parametrize(
    ("durations", "rounds_run", "best"),
    [
        # 1/2 + 1/2 reaches min_s (1 s) exactly: two rounds, not a third (the fast 1/8)
        ([1 / 2, 1 / 2, 1 / 8], 2, 1 / 2),
        # 1/2 + 1/4 is still short of it: a third round, then 1.25 s is enough
        ([1 / 2, 1 / 4, 1 / 2, 1 / 8], 3, 1 / 4),
    ],
)
def test_the_probe_runs_rounds_until_the_time_spent_reaches_min_s(
    monkeypatch: pytest.MonkeyPatch, durations: list[float], rounds_run: int, best: float
) -> None:
    clock = fake_perf_counter(durations)
    reads: list[float] = []

    def perf_counter() -> float:
        reads.append(clock.perf_counter())
        return reads[-1]

    monkeypatch.setattr(membw, "time", SimpleNamespace(perf_counter=perf_counter))
    # one round asked, min_s 1 s: rounds go on while the time spent is below 1 s
    assert membw.copy_rate(16, 1, 1, min_s=1.0) == 2 * 16 / best / 1e9
    assert len(reads) == 2 * rounds_run


def test_the_probe_accepts_a_single_byte() -> None:
    # the refusal is for no bytes (size <= 0): one byte is a (tiny) probe
    probed = probe_bandwidth(size=1, rounds=1, threads=1, min_s=0)
    assert probed.threads == 1 and probed.gb_s > 0


# Decode far below the memory roofline on the CPU (issue 48): what holds it, named from
# what was measured. The bundled model's figures of the issue: 3.7 of 31.5 GB/s (12%).
FAR_BELOW = {"implied_bandwidth_gb_s": 3.7, "decode_tok_s": 40.0, "server_source": "llama.cpp"}


def cpu_verdict(**fields: Any) -> str:
    v = verdict(metrics(**{**FAR_BELOW, **fields}), bandwidth_gb_s=31.5)
    assert v is not None and v.phase == "decode"
    assert v.roofline == "decode runs at 12% of what memory allows (3.7 of 31.5 GB/s)"
    return v.knob


def test_far_below_the_roofline_on_a_busy_machine_names_the_other_processes() -> None:
    """The issue's case: other work on both cores (1.6 CPUs' worth), the engine at 1
    thread of 2; llama.cpp's own decode as slow as ours (no overhead to blame)."""
    knob = cpu_verdict(busy_cpus=1.6, cpus=2, threads=1, server_decode_tok_s=41.0)
    assert knob == (
        "fewer other processes on this machine's 2 CPUs, not smaller weights: others "
        "kept 1.6 of them busy while it decoded, beside the engine's 1 thread"
    )
    v = verdict(metrics(**FAR_BELOW, busy_cpus=1.6, cpus=2, threads=1), bandwidth_gb_s=31.5)
    assert v is not None and v.line().startswith(
        "decode-bound (decode 90% · prefill 10%): try fewer"
    )
    # busy beats overhead: the time outside llama.cpp's decode is inflated by the others too
    both = cpu_verdict(busy_cpus=0.5, cpus=4, threads=4, server_decode_tok_s=100.0)
    assert both.startswith("fewer other processes on this machine's 4 CPUs") and "4 threads" in both


def test_far_below_the_roofline_with_a_token_s_time_outside_llama_cpp_names_the_overhead() -> None:
    """Quiet (0.1 CPUs' worth of others beside 2 threads on 2 CPUs), and llama.cpp's own
    decode took 16 of the 25 ms a token took (its rate 62.5 tok/s, ours 40): 36% outside."""
    knob = cpu_verdict(busy_cpus=0.1, cpus=2, threads=2, server_decode_tok_s=62.5)
    assert knob == (
        "less per-token overhead (sampling, detokenizing, the hand-over), not smaller "
        "weights: llama.cpp's own decode took 16.00 of the 25.00 ms a token took"
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        # others 0.25 CPUs and 2 threads on 2 CPUs: busy (from 0.25 on, not above it)
        ({"busy_cpus": 0.25, "cpus": 2, "threads": 2}, "fewer other"),
        ({"busy_cpus": 0.24, "cpus": 2, "threads": 2}, "smaller or more quantized"),
        # 1.0 of others beside 1 thread on 2 CPUs fits the cores: not busy
        ({"busy_cpus": 1.0, "cpus": 2, "threads": 1}, "smaller or more quantized"),
        ({"busy_cpus": 1.01, "cpus": 2, "threads": 1}, "fewer other"),
        # 25% of a token's time outside llama.cpp's decode is overhead, 24% is not:
        # ours 40 tok/s (25 ms), llama.cpp's 1000 / 18.75 (75%) and 1000 / 19 (76%)
        ({"server_decode_tok_s": 1000 / 18.75}, "less per-token overhead"),
        ({"server_decode_tok_s": 1000 / 19}, "smaller or more quantized"),
        # llama.cpp's rate from a server is not the local engine's: not overhead
        ({"server_decode_tok_s": 100.0, "server_source": "timings"}, "smaller or more"),
        # nothing measured beside the roofline: the weights, as before
        ({}, "smaller or more quantized"),
    ],
)
def test_what_holds_decode_far_below_the_roofline_at_its_edges(
    fields: dict[str, Any], named: str
) -> None:
    assert cpu_verdict(**fields).startswith(named)


def test_near_the_roofline_the_weights_are_named_whatever_else_was_measured() -> None:
    """At 50% of what memory allows the weights hold decode: a busy machine or overhead
    measured beside it are not the knob."""
    m = metrics(
        implied_bandwidth_gb_s=15.75,
        busy_cpus=1.6,
        cpus=2,
        threads=1,
        server_source="llama.cpp",
        server_decode_tok_s=1000.0,
    )
    v = verdict(m, bandwidth_gb_s=31.5)
    assert v is not None and v.knob.startswith("smaller or more quantized weights")
    below = verdict(replace(m, kv=replace(m.kv, implied_bandwidth_gb_s=15.7)), bandwidth_gb_s=31.5)
    assert below is not None and below.knob.startswith("fewer other processes")
    # without a measured bandwidth there is no roofline to be far below
    unknown = verdict(m)
    assert unknown is not None and unknown.knob.startswith("smaller or more quantized")
