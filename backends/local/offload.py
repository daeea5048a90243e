"""Where llama.cpp puts a model's layers for a `--gpu-layers`, and the bytes one decode
step reads from each memory: the roofline's split between the GPU and the host.

llama.cpp (`load_tensors` in src/llama-model.cpp, as llama-cpp-python 0.3.x vendors it)
numbers the repeating layers 0..n-1 and the output layer n, and puts layer `il` on the
GPU when `il >= n + 1 - n_gpu_layers`: the GPU takes the last layers, and the output
layer first of all (`-ngl 1` offloads the output layer alone; `-ngl n+1` or more, or
llama-cpp-python's -1, every layer). The input embedding stays on the CPU ("very little
benefit") and reads one row a token. A layer's KV cache lives with the layer
(`offload_kqv`, on by default). With several GPUs the offloaded layers are shared out
between them; all of them count as "the GPU" here.
"""

from __future__ import annotations

from dataclasses import dataclass

from phasechat.backends.local.gguf import LayerBytes

#: llama-cpp-python's `n_gpu_layers=-1`, as it passes it on: every layer
ALL_LAYERS = 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class Split:
    """The bytes a decode step reads from the GPU's memory and from the host's, and
    where the layers are."""

    gpu_bytes: int
    cpu_bytes: int
    #: repeating layers on the GPU, of `n_layers`, and whether the output layer is there
    gpu_layers: int
    n_layers: int
    output_on_gpu: bool

    @property
    def partial(self) -> bool:
        """Some of a token's reads are in host memory."""
        return self.cpu_bytes > 0


def on_gpu(gpu_layers: int, n_layers: int) -> list[bool]:
    """For each layer 0..n_layers (the last one the output layer), whether llama.cpp
    puts it on the GPU for `gpu_layers` (`--gpu-layers`, llama.cpp's `n_gpu_layers`;
    negative: all)."""
    ngl = ALL_LAYERS if gpu_layers < 0 else gpu_layers
    start = max(n_layers + 1 - ngl, 0)
    active = min(ngl, n_layers + 1)
    return [start <= il and il - start < active for il in range(n_layers + 1)]


def split(weights: LayerBytes, gpu_layers: int, kv_bytes: int) -> Split | None:
    """The bytes a decode step reads on each side with `gpu_layers` offloaded and
    `kv_bytes` of KV cache held (shared by the layers evenly); None when no layer is on
    the GPU."""
    n = len(weights.blocks)
    where = on_gpu(gpu_layers, n)
    if not any(where):
        return None
    layers = sum(where[:n])
    gpu = sum(size for size, here in zip(weights.blocks, where, strict=False) if here)
    gpu += weights.output if where[n] else 0
    kv_gpu = kv_bytes * layers // n if n else 0
    return Split(gpu + kv_gpu, weights.total - gpu + kv_bytes - kv_gpu, layers, n, where[n])
