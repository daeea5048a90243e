"""The roofline with layers on a GPU, by known answers: where llama.cpp puts the layers
for a --gpu-layers (backends/offload.py), the bytes of each layer read from a GGUF's
tensor table (backends/gguf.py), the split of a token's reads between the GPU and the
host and the advice that fits the regime (telemetry/verdict.py), the largest context
from free GPU memory (chat/roofline.py), and the lines `doctor` prints for a GPU."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from phasechat.backends.events import Finished, KVStats, TextDelta
from phasechat.backends.local.cuda import Device, Gpus
from phasechat.backends.local.gguf import Geometry, LayerBytes, geometry, layer_bytes
from phasechat.backends.local.offload import on_gpu, split
from phasechat.chat.roofline import Bandwidth, ceilings, largest_context, largest_context_offloaded
from phasechat.cli.commands import doctor
from phasechat.telemetry.metrics import compute, metrics_from_dict
from phasechat.telemetry.recorder import Trace
from phasechat.telemetry.verdict import KNOBS, verdict
from tests.test_verdict import metrics

MS = 1_000_000
H200 = "NVIDIA H200, measured by a device-to-device copy"


# -- where the layers go -------------------------------------------------------------


@pytest.mark.parametrize(
    ("ngl", "where"),
    [
        (0, "....."),
        (1, "....G"),  # the output layer goes first (an older llama.cpp: layer 3 first)
        (2, "...GG"),
        (4, ".GGGG"),
        (5, "GGGGG"),  # every layer and the output layer
        (99, "GGGGG"),
        (-1, "GGGGG"),  # llama-cpp-python's "all"
    ],
)
def test_llama_cpp_offloads_the_last_layers_and_the_output_layer_first(
    ngl: int, where: str
) -> None:
    assert "".join("G" if gpu else "." for gpu in on_gpu(ngl, 4)) == where


def test_a_token_s_reads_split_by_layer_with_each_layer_s_kv_cache() -> None:
    weights = LayerBytes((10, 20, 30, 40), output=100)
    partial = split(weights, 2, kv_bytes=400)  # layer 3 and the output layer
    assert partial is not None
    # GPU: 40 + 100 of weights, a quarter of the KV cache; the host: the rest
    assert (partial.gpu_bytes, partial.cpu_bytes) == (240, 360)
    assert (partial.gpu_layers, partial.n_layers, partial.output_on_gpu) == (1, 4, True)
    assert partial.partial
    whole = split(weights, -1, kv_bytes=400)
    assert whole is not None and (whole.gpu_bytes, whole.cpu_bytes) == (600, 0)
    assert not whole.partial
    assert split(weights, 0, kv_bytes=400) is None


def test_each_layer_s_bytes_come_from_the_tensor_table() -> None:
    tied = {
        "token_embd.weight": 1000,
        "blk.0.attn_q.weight": 10,
        "blk.0.ffn_up.weight": 5,
        "blk.1.attn_q.weight": 7,
        "output_norm.weight": 2,
    }
    # tied: the output layer reads the whole token embedding, once a token
    assert layer_bytes(tied, 2) == LayerBytes((15, 7), 1002)
    # untied: the output matrix; the embedding is read a row a token, left out
    assert layer_bytes({**tied, "output.weight": 300}, 2) == LayerBytes((15, 7), 302)
    assert layer_bytes({**tied, "blk.2.attn_q.weight": 1}, 2) is None  # no layer 2
    assert layer_bytes({**tied, "blk.².attn_q.weight": 1}, 2) is None
    assert layer_bytes({}, 2) is None


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: Path, tensors: list[tuple[str, int]], trailing: int = 0) -> Path:
    """A GGUF v3 file: llama metadata for 2 layers and `tensors` (name, bytes) one after
    another in the data section, each padded to 32 bytes."""
    meta = [
        ("general.architecture", 8, _string("llama")),
        ("llama.block_count", 4, struct.pack("<I", 2)),
        ("llama.attention.head_count", 4, struct.pack("<I", 4)),
        ("llama.embedding_length", 4, struct.pack("<I", 64)),
    ]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head += b"".join(_string(k) + struct.pack("<I", t) + v for k, t, v in meta)
    offset, data = 0, b""
    for name, size in tensors:
        head += (
            _string(name) + struct.pack("<I", 1) + struct.pack("<Q", size) + struct.pack("<I", 0)
        )
        head += struct.pack("<Q", offset)
        padded = -(-size // 32) * 32
        data += b"\x01" * size + b"\0" * (padded - size)
        offset += padded
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + data[: len(data) - trailing])
    return path


def test_a_gguf_s_layers_are_sized_from_its_offsets(tmp_path: Path) -> None:
    tensors = [
        ("token_embd.weight", 640),
        ("blk.0.attn_q.weight", 96),
        ("blk.1.attn_q.weight", 64),
        ("output_norm.weight", 32),
    ]
    g = geometry(write_gguf(tmp_path / "m.gguf", tensors))
    assert g.weights == LayerBytes((96, 64), 640 + 32)
    # a file cut inside its data: the sizes do not add up, so they are unknown
    assert geometry(write_gguf(tmp_path / "cut.gguf", tensors, trailing=40)).weights is None


@pytest.mark.model
def test_the_bundled_model_s_layers_add_up_to_what_llama_cpp_loads(model_path: Path) -> None:
    import llama_cpp

    g = geometry(model_path)
    assert g.weights is not None and len(g.weights.blocks) == g.n_layers == 30
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=64, n_gpu_layers=0, verbose=False)
    try:
        # SmolLM2 ties its output to its embedding: counted once, as llama.cpp counts it
        assert g.weights.total == llama_cpp.llama_model_size(llm.model)
    finally:
        llm.close()


def test_the_split_reaches_the_metrics_through_the_engine_s_kv_report() -> None:
    t = Trace("local", "m")
    for i in range(11):
        t.observe(TextDelta("x", 1), (100 + i) * MS)  # 1,000 tok/s
    t.observe(KVStats(5, 64, 1000, 9000, 90_000, gpu_bytes=60_000, cpu_bytes=31_000), 111 * MS)
    t.observe(Finished("stop"), 112 * MS)
    m = compute(t)
    assert (m.gpu_bytes_per_token, m.cpu_bytes_per_token) == (60_000, 31_000)
    back = metrics_from_dict(m.as_dict())  # kept with the answer and read back
    assert (back.gpu_bytes_per_token, back.cpu_bytes_per_token) == (60_000, 31_000)


# -- the roofline and the advice -----------------------------------------------------


def test_a_fully_offloaded_answer_is_held_to_the_gpu_s_bandwidth_and_its_overhead_named() -> None:
    # the H200 answer: 88 MB a token at 1,000 tok/s
    m = metrics(
        decode_tok_s=1000.0,
        implied_bandwidth_gb_s=88.0,
        gpu_bytes_per_token=88_000_000,
        cpu_bytes_per_token=0,
    )
    v = verdict(m, bandwidth_gb_s=164.9, gpu_gb_s=4400.0, gpu_label=H200)
    assert v is not None
    assert v.roofline == (
        "decode runs at 2% of what the GPU's memory allows (88.0 of 4,400 GB/s, "
        f"{H200}; 1.00 ms a token where memory needs 0.02)"
    )
    assert "53%" not in v.line() and "164.9" not in v.line()  # never the host's DRAM
    assert v.knob == (
        "less per-token overhead (kernel launches, Python, sampling), not smaller weights: "
        "a token takes 1.00 ms where memory needs 0.02"
    )


def test_a_partial_offload_says_both_shares_and_names_more_layers() -> None:
    m = metrics(decode_tok_s=60.0, gpu_bytes_per_token=2_000_000_000, cpu_bytes_per_token=1e9)
    v = verdict(m, bandwidth_gb_s=100.0, gpu_gb_s=4000.0, gpu_label=H200)
    assert v is not None
    # memory needs 2 GB / 4,000 GB/s + 1 GB / 100 GB/s = 0.5 + 10 ms; a token took 16.67
    # (one bandwidth for all 3 GB would say 3% or 180%)
    assert v.roofline == (
        "decode runs at 63% of what memory allows: a token reads 2.00 GB on the GPU "
        f"(0.50 ms at 4,000 GB/s, {H200}) and 1.00 GB in host memory (10.00 ms at 100.0 GB/s); "
        "16.67 ms a token where memory needs 10.50"
    )
    assert v.knob == (
        "more layers on the GPU (a higher --gpu-layers, -1 for all): the part of each token "
        "read in host memory takes 10.00 of the 10.50 ms memory needs"
    )
    # the host's part the smaller (1 of 3 ms) and a token at 10 ms: overhead, not layers
    few = metrics(decode_tok_s=100.0, gpu_bytes_per_token=8e9, cpu_bytes_per_token=1e8)
    judged = verdict(few, bandwidth_gb_s=100.0, gpu_gb_s=4000.0)
    assert judged is not None and judged.knob.startswith("less per-token overhead")
    assert judged.knob.endswith("a token takes 10.00 ms where memory needs 3.00")


def test_a_gpu_answer_near_its_roofline_is_told_to_shrink_the_weights() -> None:
    # 4 GB a token at 4,000 GB/s: 1 ms; 800 tok/s is 1.25 ms: 80%, memory-bound
    m = metrics(decode_tok_s=800.0, gpu_bytes_per_token=4_000_000_000, cpu_bytes_per_token=0)
    v = verdict(m, gpu_gb_s=4000.0)
    assert v is not None and v.knob == KNOBS["decode"]
    assert v.roofline.startswith("decode runs at 80% of what the GPU's memory allows")
    cut = verdict(metrics(decode_tok_s=1000.0, finish="length", gpu_bytes_per_token=88_000_000,
                          cpu_bytes_per_token=0), gpu_gb_s=4400.0)  # fmt: skip
    assert cut is not None
    assert cut.knob.startswith("a lower max_tokens (the answer stopped at it), less per-token")


def test_a_gpu_roofline_without_the_gpu_s_bandwidth_is_unknown_not_the_host_s() -> None:
    m = metrics(decode_tok_s=1000.0, gpu_bytes_per_token=88_000_000, cpu_bytes_per_token=0)
    v = verdict(m, bandwidth_gb_s=164.9)
    assert v is not None
    assert v.roofline == (
        "roofline unknown: the GPU's memory bandwidth is not known (no CUDA runtime)"
    )
    assert v.knob == KNOBS["decode"]  # no regime without a figure to judge it by
    partial = metrics(decode_tok_s=60.0, gpu_bytes_per_token=10**9, cpu_bytes_per_token=10**9)
    for bad in (None, float("nan"), 0.0):
        judged = verdict(partial, bandwidth_gb_s=bad, gpu_gb_s=4000.0)
        assert judged is not None
        assert (
            judged.roofline == "roofline unknown: this machine's memory bandwidth is not measured"
        )


def test_a_cpu_answer_keeps_its_roofline_and_its_knob() -> None:
    v = verdict(metrics(decode_tok_s=70.0, implied_bandwidth_gb_s=5.0), 20.0, gpu_gb_s=4000.0)
    assert v is not None and v.knob == KNOBS["decode"]
    assert v.roofline == "decode runs at 25% of what memory allows (5.0 of 20.0 GB/s)"


class Calls:
    def __init__(self, value: Any) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


def test_each_bandwidth_is_found_only_where_the_answer_read_from_that_memory() -> None:
    host = Calls(Bandwidth(150.0, 1_750_000_000.0, cached=True))
    two = Gpus(
        "rt",
        "12.4",
        (Device(0, "A", None, None, 900.0), Device(1, "B", None, None, 2000.0, 1800.0)),
    )
    gpus = Calls(two)
    whole = ceilings(
        metrics(decode_tok_s=9.0, gpu_bytes_per_token=10, cpu_bytes_per_token=0), host, gpus
    )
    assert (host.calls, gpus.calls) == (0, 1)  # no second of host probing for nothing
    assert whole.cpu_gb_s is None and whole.gpu_gb_s == 1800.0
    assert whole.gpu_label == "B, measured by a device-to-device copy, the fastest of 2"
    partial = ceilings(metrics(gpu_bytes_per_token=10, cpu_bytes_per_token=5), host, gpus)
    assert (partial.cpu_gb_s, partial.gpu_gb_s) == (150.0, 1800.0) and host.calls == 1
    cpu = ceilings(metrics(implied_bandwidth_gb_s=5.0), host, gpus)
    assert (cpu.cpu_gb_s, cpu.gpu_gb_s, gpus.calls) == (150.0, None, 2)
    none = ceilings(metrics(gpu_bytes_per_token=10, cpu_bytes_per_token=0), host, Calls(None))
    assert none.gpu_gb_s is None and none.gpu_label == ""


# -- the largest context from free GPU memory ----------------------------------------


def small_geometry() -> Geometry:
    # 4 layers, 1 KV head of 8 + 8 dims at f16: 32 bytes a layer, 128 a token
    return Geometry("llama", "m", 4, 1, 1, 8, 8, 4096, None, 0, 1000, LayerBytes((100,) * 4, 200))


def test_the_largest_context_fits_the_kv_cache_beside_the_weights_on_each_side() -> None:
    g = small_geometry()
    assert g.kv_bytes(1, 1) == 128
    whole = split(g.weights or LayerBytes((), 0), -1, 0)
    assert whole is not None and whole.gpu_bytes == 600
    # all on the GPU: (1,885 - 600) // 128 = 10 (the host's formula, 1,000 of weights: 6)
    assert largest_context_offloaded(g, whole, 1885, None) == (10, "GPU")
    assert largest_context(g, g.file_bytes, 1885) == 6
    # --gpu-layers 3: layers 2, 3 and the output layer; half the KV cache on each side
    part = split(g.weights or LayerBytes((), 0), 3, 0)
    assert part is not None and (part.gpu_bytes, part.gpu_layers) == (400, 2)
    gpu_free, host_free = 400 + 64 * 100, (1000 - 400) + 64 * 30
    assert largest_context_offloaded(g, part, gpu_free, host_free) == (30, "host")
    assert largest_context_offloaded(g, part, gpu_free, None) == (100, "GPU")
    assert largest_context_offloaded(g, part, 300, host_free) == (0, "GPU")  # weights alone
    # --gpu-layers 1: the output layer alone; the whole KV cache in host memory
    out = split(g.weights or LayerBytes((), 0), 1, 0)
    assert out is not None and out.gpu_layers == 0
    assert largest_context_offloaded(g, out, 1000, 800 + 128 * 5) == (5, "host")


def test_doctor_names_the_gpu_its_memory_its_bandwidth_and_the_layers_on_it() -> None:
    h200 = Device(0, "NVIDIA H200", 139 * 2**30, 140 * 2**30, 4022.8, 3900.0)
    lines = doctor.gpu_lines(Gpus("/usr/lib/libcudart.so.12", "12.4", (h200,)))
    assert lines[0] == (
        "GPU 0             NVIDIA H200, 139.0 of 140.0 GiB free "
        "(CUDA runtime 12.4, /usr/lib/libcudart.so.12)"
    )
    assert lines[1].startswith("  bandwidth       3,900 GB/s (256 MiB copied device to device")
    assert lines[1].endswith("measured now); specified 4,023 GB/s (memory clock x bus width)")
    unmeasured = Device(0, "NVIDIA H200", None, None, 4022.8, None, "cudaMalloc: CUDA error 2")
    (_, line) = doctor.gpu_lines(Gpus("libcudart.so", "", (unmeasured,)))
    assert "not measured (cudaMalloc: CUDA error 2); specified 4,023 GB/s" in line
    assert "no CUDA runtime" in doctor.gpu_lines(None)[0]
    g = small_geometry()
    part = split(g.weights or LayerBytes((), 0), 3, 0)
    assert part is not None
    assert doctor.placement(part, 3).startswith(
        "2 of 4 layers and the output layer (--gpu-layers 3)"
    )
    line = doctor.context_line(g, part, (400 + 64 * 100, "NVIDIA H200"), (1000 - 400) + 64 * 30)
    assert line.startswith("largest context 30 tokens fit in free GPU memory")
    assert "on NVIDIA H200 and 0.0 GiB MemAvailable; the host's memory sets it" in line
    # two devices share the layers: their free memory together; one unknown: no figure
    pair = Gpus("rt", "", (Device(0, "A", 3 * 2**30, 4 * 2**30, None),) * 2)
    assert doctor.gpu_free(pair) == (6 * 2**30, "2 devices")
    assert doctor.gpu_free(Gpus("rt", "", (Device(0, "A", None, None, None),))) is None
    assert doctor.gpu_free(None) is None


@pytest.mark.model
def test_the_engine_reports_the_split_for_its_gpu_layers(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    from phasechat.backends.local.llama_glue import kv_stats

    g = geometry(model_path)
    assert g.weights is not None
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=64, n_gpu_layers=10, verbose=False)
    try:
        llm.eval([1, 2, 3, 4])
        cpu_build = kv_stats(llm, g, g.weights.total)
        assert cpu_build.gpu_bytes is None and cpu_build.cpu_bytes is None  # nothing offloads
        # as a build that offloads reports it: the output layer and the last 9 layers
        monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
        stats = kv_stats(llm, g, g.weights.total)
        assert stats.used_bytes == g.kv_bytes(4, 64) > 0
        expected = split(g.weights, 10, stats.used_bytes)
        assert expected is not None and expected.gpu_layers == 9 and expected.output_on_gpu
        assert (stats.gpu_bytes, stats.cpu_bytes) == (expected.gpu_bytes, expected.cpu_bytes)
        assert (stats.gpu_bytes or 0) + (stats.cpu_bytes or 0) == g.weights.total + stats.used_bytes
    finally:
        llm.close()


def test_per_layer_kv_heads_are_read_at_the_first_layer(tmp_path: Path) -> None:
    """Issue 49: a model whose KV heads are an array by layer (OpenELM's shape), layer 0
    unlike the last: the geometry's KV heads are layer 0's."""
    import gguf

    path = tmp_path / "layered.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 3)
    writer.add_uint32("llama.attention.head_count", 8)
    writer.add_uint32("llama.embedding_length", 64)
    writer.add_array("llama.attention.head_count_kv", [2, 4, 8])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    g = geometry(path)
    assert (g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim_k) == (3, 8, 2, 8)
