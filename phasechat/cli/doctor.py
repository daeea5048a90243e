"""`phasechat doctor`: what llama.cpp was built with, what the default model is, this
machine's memory bandwidth (the roofline's ceiling) and the context that fits in it.

The bandwidth is probed every time (all cores copying at once) and shown beside the best
kept figure with the load it was measured under; a busy or lower probe is not kept."""

from __future__ import annotations

import time
from pathlib import Path

from phasechat.backends.gguf import GGUFError, geometry
from phasechat.backends.llama_glue import physical_cores
from phasechat.backends.measured import busy, share_text
from phasechat.backends.models import ModelNotFound, default_model_path
from phasechat.chat.roofline import (
    bandwidth_file,
    largest_context,
    machine_bandwidth,
    mem_available,
)
from phasechat.cli.build_info import llama_build, not_importable


def report() -> str:
    """A human-readable report, one fact per line."""
    lines: list[str] = []
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
    lines.append(f"  {_flash(path, cores)}")
    available = mem_available()
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


def _how(threads: int) -> str:
    """How the probe copied: all cores at once, summed, or (an older entry) one core."""
    if threads == 1:
        return "one thread copying 128 MiB: one core's copy"
    return f"{threads} threads copying 128 MiB at once: all cores, summed"


def _flash(path: Path, threads: int) -> str:
    """Flash attention for this model on the CPU: the cached choice, else measured now."""
    try:
        from phasechat.backends.flash import choose

        choice, notice = choose(path, threads)
        line = f"{'attention':<16}{choice.summary} at {threads} threads"
        if not choice.busy:  # a busy one says so in its summary
            line += f", {share_text(choice.others)} while it was measured"
        return line if notice is None else f"{line}\n  {'':<16}{notice}"
    except Exception as exc:  # no llama.cpp, or a model it cannot load
        return f"{'attention':<16}flash attention not measured: {exc}"
