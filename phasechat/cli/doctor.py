"""`phasechat doctor`: what llama.cpp was built with, what the default model is, this
machine's memory bandwidth (the roofline's ceiling) and the context that fits in it."""

from __future__ import annotations

import time
from pathlib import Path

from phasechat.backends.gguf import GGUFError, geometry
from phasechat.backends.llama_glue import physical_cores
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
    """This machine's memory bandwidth: probed once (about 0.3 s), then cached."""
    bw = machine_bandwidth()
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(bw.measured_at))
    how = f"cached, probed {when}" if bw.cached else "probed now"
    return (
        f"memory bandwidth  {bw.gb_s:.1f} GB/s (one core copying 128 MiB, best of 6; "
        f"{how}; {bandwidth_file()})"
    )


def _flash(path: Path, threads: int) -> str:
    """Flash attention for this model on the CPU: the cached choice, else measured now."""
    try:
        from phasechat.backends.flash import choose

        choice, notice = choose(path, threads)
        line = f"{'attention':<16}{choice.summary} at {threads} threads"
        return line if notice is None else f"{line}\n  {'':<16}{notice}"
    except Exception as exc:  # no llama.cpp, or a model it cannot load
        return f"{'attention':<16}flash attention not measured: {exc}"
