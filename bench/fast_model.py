"""A model that decodes at GPU token rates on a 2-core CPU: the bundled SmolLM2's
tokenizer, chat template and architecture, with random weights in 2 narrow layers.

    .venv/bin/python -m bench.fast_model [OUT.gguf]     # prints the path it wrote

On a GPU the bundled 135M model decodes at ~900 tok/s, where each step is about a
millisecond and the Python around `llama_decode` (sampling, detokenizing, the recorder,
the UI's share of the interpreter) is most of it. On this CPU the real model decodes at
~100 tok/s, where the same Python is a few percent and any cost it has stays hidden.
This model makes the CPU step as short as the GPU's: width 64, 2 layers, 1 KV head, so a
step is the 49,152-token output layer and little else, and the Python per token shows
as it does on the GPU. Same vocabulary and template, so prompts tokenize exactly as they
do on the bundled model; the answers are nonsense (random weights), never end by
themselves (the end-of-generation tokens' embeddings are zero, so their logit is 0
where the maximum is above it), and cost the same per token whatever they say.

Written with gguf-py (llama.cpp's own GGUF writer, PyPI `gguf`); every metadata field
of the bundled file is copied but the ones that give the shape. `cached()` writes it once
per machine into phasechat's cache folder (keyed by the source file and this shape).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from phasechat.backends.local.models import default_model_path

N_LAYERS = 2
N_EMBD = 64
N_FF = 128
N_HEAD = 2
N_HEAD_KV = 1
HEAD_DIM = N_EMBD // N_HEAD
STD = 0.02  # the weights' spread: logits stay small, no token dominates by accident

#: the shape, overriding the bundled file's fields of the same names
SHAPE = {
    "block_count": N_LAYERS,
    "embedding_length": N_EMBD,
    "feed_forward_length": N_FF,
    "attention.head_count": N_HEAD,
    "attention.head_count_kv": N_HEAD_KV,
    "rope.dimension_count": HEAD_DIM,
}


def write(out: Path, source: Path | None = None, seed: int = 0) -> Path:
    """Write the fast model to `out` (from `source`, default the bundled GGUF)."""
    import gguf  # a dev dependency (pyproject.toml [dev]): only benchmarks and tests need it
    import numpy as np

    src = source or default_model_path()
    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    shaped = {f"{arch}.{key}": value for key, value in SHAPE.items()}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        value: Any = field.contents()
        if name in shaped:
            value = shaped.pop(name)
        elif name == "general.name":
            value = f"{value} (random weights, {N_LAYERS} layers of {N_EMBD}: bench.fast_model)"
        elif name == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_key_value(name, value, vtype, sub)
    for name, value in shaped.items():  # a shape field the bundled file leaves out
        writer.add_key_value(name, value, gguf.GGUFValueType.UINT32)

    rng = np.random.default_rng(seed)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)

    def matrix(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * STD).astype(np.float16)

    def norm() -> Any:
        return np.ones(N_EMBD, dtype=np.float32)

    embd = matrix(n_vocab, N_EMBD)  # tied: the output layer too (SmolLM2 has no output.weight)
    embd[_eog_ids(reader)] = 0
    writer.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYERS):
        for name, data in (
            ("attn_norm", norm()),
            ("attn_q", matrix(N_EMBD, N_EMBD)),
            ("attn_k", matrix(N_HEAD_KV * HEAD_DIM, N_EMBD)),
            ("attn_v", matrix(N_HEAD_KV * HEAD_DIM, N_EMBD)),
            ("attn_output", matrix(N_EMBD, N_EMBD)),
            ("ffn_norm", norm()),
            ("ffn_gate", matrix(N_FF, N_EMBD)),
            ("ffn_up", matrix(N_FF, N_EMBD)),
            ("ffn_down", matrix(N_EMBD, N_FF)),
        ):
            writer.add_tensor(f"blk.{i}.{name}.weight", data)
    writer.add_tensor("output_norm.weight", norm())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)  # whole or not at all: a reader never sees half a file
    return out


def _eog_ids(reader: Any) -> list[int]:
    """The ids of the tokens that end a turn: the ones the header names, and the ones
    llama.cpp's own end-of-generation list finds by their text (`<|im_end|>`,
    `<|endoftext|>` in the bundled template)."""
    named = [
        int(f.contents())
        for key in ("eos_token_id", "eot_token_id", "eom_token_id")
        if (f := reader.fields.get(f"tokenizer.ggml.{key}")) is not None
    ]
    tokens = reader.fields["tokenizer.ggml.tokens"]
    wanted = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"}
    texts = [i for i, idx in enumerate(tokens.data) if bytes(tokens.parts[idx]).decode() in wanted]
    return sorted({*named, *texts})


def cached(folder: Path | None = None) -> Path:
    """The fast model, written once into `folder` (default phasechat's cache folder,
    `$XDG_CACHE_HOME/phasechat/fast-model`) and reused while the bundled file and this
    shape are the same."""
    src = default_model_path()
    stat = src.stat()
    key = hashlib.sha256(
        f"{src.name} {stat.st_size} {sorted(SHAPE.items())} {STD}".encode()
    ).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phasechat"
    folder = folder or base / "fast-model"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"SmolLM2-fast-{key}.gguf"
    return path if path.exists() else write(path, src)


def resolve(model: str | None) -> Path:
    """A benchmark's `--model`: 'fast' (this model), a GGUF path, or None (the bundled)."""
    if model == "fast":
        return cached()
    return Path(model) if model else default_model_path()


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(write(target) if target else cached())
