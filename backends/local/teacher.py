"""Teacher-forced logits from the local engine under one engine setting: the same token
sequence read in one evaluation, and the next-token logits at each position of its
answer (telemetry/divergence.py compares two settings' logits).

Each setting gets a context of its own on the model file (llama.cpp maps the weights;
loading the bundled model twice costs a fraction of a second), sized to the sequence,
with `logits_all` so that every position's logits are kept. A quantized V cache needs
flash attention in llama.cpp: `kv=q8_0` and `kv=q4_0` turn it on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from phasechat.backends.base import Stopped
from phasechat.backends.local.gguf import KV_TYPE_BYTES, KV_TYPE_NAMES
from phasechat.backends.local.llama_logs import quiet_llama, verbose

#: tokens read per evaluation step (llama.cpp's batch): a step between progress reports
BATCH = 512


@dataclass(frozen=True, slots=True)
class EngineSetting:
    """What one side of a comparison changes: the KV cache type, flash attention (None:
    on for a quantized cache, llama.cpp's choice otherwise), threads, GPU layers (a GPU
    sums in another order than the CPU: read where the side runs), and how many
    tokens one evaluation step reads (`batch`: 1 reads the sequence as decode does, a
    token a step; the default as a prefill does)."""

    kv: str = "f16"
    flash_attn: bool | None = None
    threads: int | None = None
    batch: int = BATCH
    #: layers offloaded to the GPU, as the side loaded them (-1 all; 0 on a CPU build,
    #: where llama.cpp ignores any other number)
    gpu_layers: int = 0

    def __post_init__(self) -> None:
        if self.kv not in KV_TYPE_NAMES:
            raise ValueError(f"kv={self.kv!r}: one of {', '.join(KV_TYPE_NAMES)}")
        if self.kv != "f16" and self.flash_attn is False:
            raise ValueError(f"kv={self.kv} needs flash attention (llama.cpp's quantized V cache)")
        if not 1 <= self.batch <= BATCH:
            raise ValueError(f"batch={self.batch}: 1 to {BATCH} tokens a step")

    @property
    def bytes_per_value(self) -> float:
        return KV_TYPE_BYTES[KV_TYPE_NAMES[self.kv]]

    @property
    def label(self) -> str:
        flash = (
            "" if self.flash_attn is None else f" flash_attn={'on' if self.flash_attn else 'off'}"
        )
        batch = "" if self.batch == BATCH else f" batch={self.batch}"
        gpu = f" gpu_layers={self.gpu_layers}" if self.gpu_layers else ""
        return f"kv={self.kv}{flash}{batch}{gpu}"


def forced_logits(
    model: Path,
    setting: EngineSetting,
    tokens: Sequence[int],
    start: int,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> npt.NDArray[np.float32]:
    """The logits predicting `tokens[start:]`, each from the tokens before it, read in one
    evaluation under `setting`: shape (len(tokens) - start, vocabulary). The sequence is
    read a batch at a time: `progress(read, total)` after each; a set `stop` raises
    `Stopped` at the next batch (a view's Esc)."""
    if not 0 < start < len(tokens):
        raise ValueError(f"the answer starts at {start} of {len(tokens)} tokens")
    quiet_llama()
    import llama_cpp

    ggml_type = KV_TYPE_NAMES[setting.kv]
    flash = setting.flash_attn if setting.flash_attn is not None else setting.kv != "f16"
    llm = llama_cpp.Llama(
        model_path=str(model),
        n_ctx=-(-len(tokens) // 256) * 256,
        n_batch=setting.batch,
        n_gpu_layers=setting.gpu_layers,
        n_threads=setting.threads,
        n_threads_batch=setting.threads,
        flash_attn=flash,
        type_k=ggml_type,
        type_v=ggml_type,
        logits_all=True,
        verbose=verbose(),
    )
    try:
        # the last token predicts nothing that is compared: it is not read
        read = list(tokens[:-1])
        step = setting.batch
        for i in range(0, len(read), step):
            if stop is not None and stop.is_set():
                raise Stopped
            llm.eval(read[i : i + step])
            if progress is not None:
                progress(min(i + step, len(read)), len(read))
        return np.array(llm.scores[start - 1 : len(tokens) - 1], dtype=np.float32)
    finally:
        llm.close()
