"""The next token from the logits llama.cpp just wrote: greedy, or llama.cpp's own
sampler chain. Everything here runs on the llama thread, once per token, between two
`llama_decode` calls, so it is kept to what the choice needs (bench/token_split.py
prints its cost per token beside the decode's).

Greedy is numpy's argmax over a kept view of llama.cpp's logits buffer (the first
maximum, as llama.cpp's greedy sampler picks). Sampling keeps llama.cpp's chain as
`Llama.generate` builds it (penalties, top-k 40, typical, top-p 0.95, min-p 0.05, the
temperature, a seeded draw), but hands it only the tokens that can survive its top-k:
`llama_sampler_sample` would copy all n_vocab logits into a candidate array (49,152 for
the bundled model) and partial-sort it, every token, to keep 40. Every sampler after
top-k sees the same k tokens in the same order, and the draw takes one number from the
seeded generator whatever the array's size, so a seed gives the same tokens as before.
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


def sampled(llm: Any, temp: float) -> Callable[[], int]:
    """A token drawn by llama.cpp's sampler chain at `temp` (with the seed the context was
    given: `Llama.set_seed`), from the top-k candidates only (the module's docstring)."""
    import llama_cpp.llama_cpp as lib
    import numpy as np

    chain = llm._init_sampler(top_k=TOP_K, top_p=TOP_P, min_p=MIN_P, temp=temp)
    view = LogitsView(llm)
    n = int(llm.n_vocab())
    data = (lib.llama_token_data * n)()
    record = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
    assert record.itemsize == ctypes.sizeof(lib.llama_token_data)
    rows = np.frombuffer(memoryview(data), dtype=record)
    ids, logits, probs = rows["id"], rows["logit"], rows["p"]
    cur = lib.llama_token_data_array(data, 0, -1, False)
    cur_p = ctypes.byref(cur)
    apply, accept = lib.llama_sampler_apply, lib.llama_sampler_accept
    within = TopCandidates(TOP_K, n)

    def sample() -> int:
        x = view()
        keep = within(x)
        m = len(keep)
        ids[:m] = keep
        logits[:m] = x[keep]
        probs[:m] = 0.0  # as llama_sampler_sample writes them: the chain computes its own
        cur.data, cur.size, cur.selected, cur.sorted = data, m, -1, False
        apply(chain.sampler, cur_p)  # its top-k sorts these m and keeps k
        token = int(cur.data[cur.selected].id)  # a sampler may have moved `data`
        accept(chain.sampler, token)
        return token

    return sample


class TopCandidates:
    """The token ids that a top-k can keep: every one of the k largest logits, and few
    others, found without sorting the vocabulary. A threshold under the largest logit
    keeps them, in ascending id order as llama.cpp lists them; it lies a margin further
    below than the k-th largest did at the last token (widened until it holds k when the
    logits spread out more)."""

    MARGIN = 1.5

    def __init__(self, k: int, n_vocab: int, below: float = 8.0) -> None:
        import numpy as np

        self.k, self.below = k, below
        self._everything = np.arange(n_vocab)

    def __call__(self, logits: Any) -> Any:
        """The candidates' ids in `logits` (a float array of n_vocab)."""
        import numpy as np

        top = logits.max()
        while True:
            keep = np.flatnonzero(logits >= top - self.below)
            if len(keep) >= self.k:
                break
            if self.below > 1e6:  # fewer than k finite logits (or a NaN): all of them
                return self._everything
            self.below *= 2.0
        # the k-th largest among a few hundred at most: a partition of those only
        kth = np.partition(logits[keep], len(keep) - self.k)[len(keep) - self.k]
        self.below = max(float(top - kth) * self.MARGIN, 1e-3)
        return keep


def full_chain(llm: Any, temp: float) -> Callable[[], int]:
    """The same chain over all n_vocab candidates, as `llama_sampler_sample` builds them
    (phasechat's sampling before the top-k candidates; the reference `sampled` is tested
    and measured against)."""
    import llama_cpp.llama_cpp as lib

    chain = llm._init_sampler(top_k=TOP_K, top_p=TOP_P, min_p=MIN_P, temp=temp)
    ctx, sample = llm.ctx, lib.llama_sampler_sample
    return lambda: int(sample(chain.sampler, ctx, -1))
