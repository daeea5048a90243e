"""The next token from the logits llama.cpp just wrote: greedy, or llama.cpp's own
sampler chain. Everything here runs on the llama thread, once per token, between two
`llama_decode` calls (bench/token_split.py prints its cost per token beside the
decode's).

Greedy is numpy's argmax over a kept view of llama.cpp's logits buffer (the first
maximum, as llama.cpp's greedy sampler picks; that sampler copies all n_vocab logits
into a candidate array first: 8 against ~50 us a token). Other temperatures use the
chain `Llama.generate` builds (penalties, top-k 40, typical, top-p 0.95, min-p 0.05,
the temperature, a draw seeded by `Llama.set_seed`) through `llama_sampler_sample`.
Handing that chain only the tokens within reach of its top-k (found by numpy) was
measured and gave nothing: 49 against 54 us of thread CPU a call, beside a ~7,700 us
step (bench/README.md, issue 48).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

#: llama.cpp's chain as `Llama.generate` builds it for a temperature above 0
TOP_K, TOP_P, MIN_P = 40, 0.95, 0.05


class LogitsView:
    """The last token's logits as a numpy array over llama.cpp's own buffer (no copy),
    rebuilt only when llama.cpp moves the buffer (it reallocates it only when a batch
    needs more outputs): `as_array` on a fresh pointer costs ~45 us a token, cold after
    a decode (bench/README.md)."""

    def __init__(self, llm: Any) -> None:
        import llama_cpp.llama_cpp as lib

        self._ctx, self._n = llm.ctx, int(llm.n_vocab())
        self._logits = lib.llama_get_logits_ith
        self._address: int | None = None
        self._array: Any = None

    def __call__(self) -> Any:
        """The logits of the batch's last token (`llama_get_logits_ith` waits for the
        decode to finish first)."""
        import numpy as np

        ptr = self._logits(self._ctx, -1)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if address != self._address:
            self._address = address
            self._array = np.ctypeslib.as_array(ptr, shape=(self._n,))
        return self._array


def greedy(llm: Any) -> Callable[[], int]:
    """The most likely next token: the first maximum of the logits."""
    view = LogitsView(llm)
    return lambda: int(view().argmax())


def chain(llm: Any, temp: float) -> Callable[[], int]:
    """A token drawn by llama.cpp's sampler chain at `temp`, over all n_vocab logits."""
    import llama_cpp.llama_cpp as lib

    made = llm._init_sampler(top_k=TOP_K, top_p=TOP_P, min_p=MIN_P, temp=temp)
    ctx, sample = llm.ctx, lib.llama_sampler_sample
    return lambda: int(sample(made.sampler, ctx, -1))
