"""`phasechat doctor`: what llama.cpp was built with, what the default model is, this
machine's memory bandwidth (the roofline's ceiling) and the context that fits in it.

The bandwidth is probed every time (all cores copying at once) and shown beside the best
kept figure with the load it was measured under; a busy or lower probe is not kept.
On a build that offloads, the GPU (backends/local/cuda.py) is named with its free memory and
its bandwidth (a device-to-device copy, measured now), the model's layers on it, and the
largest context sized from the GPU's free memory where the KV cache lives there."""

from __future__ import annotations

import time
from pathlib import Path

from phasechat.backends.local.cuda import COPIES, COPY_BYTES, ROUNDS, Device, Gpus, gpus
from phasechat.backends.local.gguf import Geometry, GGUFError, geometry
from phasechat.backends.local.llama_glue import physical_cores
from phasechat.backends.local.measured import busy, share_text
from phasechat.backends.local.models import ModelNotFound, default_model_path
from phasechat.backends.local.offload import Split, split
from phasechat.chat.roofline import (
    bandwidth_file,
    largest_context,
    largest_context_offloaded,
    machine_bandwidth,
    mem_available,
)
from phasechat.cli.commands.build_info import llama_build, not_importable


def report(gpu_layers: int | None = None) -> str:
    """A human-readable report, one fact per line; `gpu_layers` as `--gpu-layers`
    (None: the default, all layers on a build that offloads)."""
    lines: list[str] = []
    offload, found = False, None
    try:
        build = llama_build()
    except ImportError as exc:
        lines.append(not_importable(exc))
    else:
        offload = build.gpu_offload
        lines += [
            *build.lines(),
            f"--gpu-layers      default {'-1 (all layers)' if offload else '0'}",
        ]
        if offload:  # the build loaded its GPU backend: its runtime is in this process
            found = gpus()
            lines += gpu_lines(found)
    layers = (-1 if offload else 0) if gpu_layers is None else gpu_layers
    cores = physical_cores()
    lines.append(
        f"physical cores    {cores} (default --threads: up to {cores}, fewer while other "
        "processes keep the cores busy)"
    )
    lines.append(bandwidth_line())
    try:
        path = default_model_path()
        g = geometry(path)
    except (ModelNotFound, GGUFError) as exc:
        lines.append(f"default model     {exc}")
        return "\n".join(lines)
    kv_token = g.kv_bytes(1, g.n_ctx_train or 1)
    swa = f", {g.n_swa_layers} sliding-window ({g.sliding_window})" if g.n_swa_layers else ""
    lines += [
        f"default model     {path}",
        f"  name            {g.name} ({g.architecture}), {g.file_bytes / 2**20:.1f} MiB",
        f"  layers          {g.n_layers}{swa}",
        f"  heads           {g.n_heads} query, {g.n_kv_heads} KV",
        f"  head dims       K {g.head_dim_k}, V {g.head_dim_v}",
        f"  context         {g.n_ctx_train} tokens (trained)",
        f"  KV per token    {kv_token:,} bytes at f16",
    ]
    where = split(g.weights, layers, 0) if offload and g.weights is not None else None
    if where is not None:
        lines.append(f"  {'on the GPU':<16}{placement(where, layers)}")
    lines.append(f"  {_flash(path, cores, on_gpu=offload and layers != 0)}")
    available = mem_available()
    free = gpu_free(found)
    if where is not None and free is not None:
        lines.append(f"  {context_line(g, where, free, available)}")
        return "\n".join(lines)
    if available is None:
        lines.append("  largest context unknown (no /proc/meminfo MemAvailable)")
        return "\n".join(lines)
    fits = largest_context(g, g.file_bytes, available)
    lines.append(
        f"  largest context {fits:,} tokens fit in free memory ({available / 2**30:.1f} GiB "
        f"MemAvailable) beside the weights, at {kv_token:,} KV bytes per token"
        + (f"; the model was trained for {g.n_ctx_train:,}" if g.n_ctx_train else "")
    )
    return "\n".join(lines)


def bandwidth_line() -> str:
    """This machine's memory bandwidth: probed now (about a second, every core copying
    at once) beside the best kept; a probe on a busy machine is shown, never kept."""
    bw = machine_bandwidth(fresh=True)
    lines = [
        f"memory bandwidth  {bw.gb_s:.1f} GB/s ({_how(bw.threads)}, best of several rounds; "
        f"{'best kept, probed' if bw.cached else 'probed now'} "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(bw.measured_at))}, "
        f"{share_text(bw.others)}"
        + ("; for this run only, not kept: busy" if bw.busy else "")
        + f"; {bandwidth_file()})"
    ]
    if bw.probed is not None:  # this run's probe, lower than the kept figure
        kept = "not kept: busy" if busy(bw.probed.others) else "lower, not kept"
        lines.append(
            f"  {'this probe':<16}{bw.probed.gb_s:.1f} GB/s ({_how(bw.probed.threads)}, "
            f"{share_text(bw.probed.others)}; {kept})"
        )
    if bw.notice is not None:
        lines.append(f"  {'':<16}{bw.notice}")
    return "\n".join(lines)


def gpu_lines(found: Gpus | None) -> list[str]:
    """The GPUs the build can use: name, free memory, bandwidth (measured, and as
    specified), or why none is named."""
    if found is None:
        return [
            f"{'GPU':<18}none named: no CUDA runtime in this process (a build that "
            "offloads through another API, or no device); the GPU's bandwidth is unknown"
        ]
    lines = []
    for d in found.devices:
        memory = (
            f"{d.free_bytes / 2**30:.1f} of {d.total_bytes / 2**30:.1f} GiB free"
            if d.free_bytes is not None and d.total_bytes is not None
            else "free memory unknown"
        )
        runtime = f"CUDA runtime {found.version}, " if found.version else ""
        lines.append(f"{'GPU ' + str(d.index):<18}{d.name}, {memory} ({runtime}{found.runtime})")
        lines.append(f"  {'bandwidth':<16}{gpu_bandwidth_text(d)}")
    return lines


def gpu_bandwidth_text(d: Device) -> str:
    """The device's memory bandwidth: the copy measured now, beside the specification."""
    spec = (
        f"specified {d.spec_gb_s:,.0f} GB/s (memory clock x bus width)"
        if d.spec_gb_s is not None
        else "specification unknown"
    )
    if d.copy_gb_s is not None:
        copy = f"{COPY_BYTES >> 20} MiB copied device to device {COPIES} times, best of {ROUNDS}"
        return f"{d.copy_gb_s:,.0f} GB/s ({copy}, measured now); {spec}"
    why = f" ({d.copy_problem})" if d.copy_problem else ""
    return f"not measured{why}; {spec}"


def placement(where: Split, layers: int) -> str:
    """Where llama.cpp puts the layers for `layers` (backends/local/offload.py)."""
    out = "and the output layer" if where.output_on_gpu else "(the output layer on the CPU)"
    return (
        f"{where.gpu_layers} of {where.n_layers} layers {out} (--gpu-layers {layers}): "
        f"{where.gpu_bytes / 2**20:,.1f} MiB of weights read a token there, "
        f"{where.cpu_bytes / 2**20:,.1f} MiB in host memory"
    )


def gpu_free(found: Gpus | None) -> tuple[int, str] | None:
    """The GPUs' free memory together (llama.cpp shares the offloaded layers out between
    them by their free memory) and where it is; None where unknown."""
    known = [d for d in found.devices if d.free_bytes is not None] if found else []
    if not known or found is None or len(known) < len(found.devices):
        return None
    where = known[0].name if len(known) == 1 else f"{len(known)} devices"
    return sum(d.free_bytes or 0 for d in known), where


def context_line(g: Geometry, where: Split, gpu: tuple[int, str], available: int | None) -> str:
    """The largest context with layers on the GPU: each layer's KV cache beside the
    weights on its side, the GPUs' free memory (`gpu`: bytes, where) and, for layers
    left on the CPU, the host's."""
    free, on = gpu
    fits, side = largest_context_offloaded(g, where, free, available)
    kv_token = g.kv_bytes(1, 1)
    host = (
        ""
        if not where.partial
        else f" and {available / 2**30:.1f} GiB MemAvailable"
        if available is not None
        else " (host memory unknown: no /proc/meminfo MemAvailable)"
    )
    return (
        f"largest context {fits:,} tokens fit in free GPU memory ({free / 2**30:.1f} GiB free "
        f"on {on}{host}; the {side}'s memory sets it) beside the weights, "
        f"at {kv_token:,} KV bytes per token"
        + (f"; the model was trained for {g.n_ctx_train:,}" if g.n_ctx_train else "")
    )


def _how(threads: int) -> str:
    """How the probe copied: all cores at once, summed, or (an older entry) one core."""
    if threads == 1:
        return "one thread copying 128 MiB: one core's copy"
    return f"{threads} threads copying 128 MiB at once: all cores, summed"


def _flash(path: Path, threads: int, on_gpu: bool = False) -> str:
    """Flash attention for this model on the CPU: the cached choice, else measured now.
    A load with layers on a GPU turns it on unmeasured (llama.cpp's auto): so said."""
    if on_gpu:
        return (
            f"{'attention':<16}flash attention on with layers on the GPU (llama.cpp's auto; "
            "not measured on the GPU)"
        )
    try:
        from phasechat.backends.local.flash import choose

        choice, notice = choose(path, threads)
        line = f"{'attention':<16}{choice.summary} at {threads} threads"
        if not choice.busy:  # a busy one says so in its summary
            line += f", {share_text(choice.others)} while it was measured"
        return line if notice is None else f"{line}\n  {'':<16}{notice}"
    except Exception as exc:  # no llama.cpp, or a model it cannot load
        return f"{'attention':<16}flash attention not measured: {exc}"
