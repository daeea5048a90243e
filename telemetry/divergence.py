"""How far one engine setting moves the answer, token by token, without sampling noise.

Teacher-forced: the reference side's answer tokens are fed to both sides, and at each
answer position the two next-token distributions are compared. Both sides read the same
tokens, so every difference is the setting's (a KV cache in q4_0, another quantization,
flash attention), never the luck of a sampler.

Figures, for the positions of one answer or of several together:
- KL divergence KL(reference || other) in nats, from the logits' log-softmax in float64:
  its mean, 99th percentile (numpy's linear interpolation), maximum and where it is;
- top-1 agreement: the share of positions where the two sides' most likely next tokens
  are the same;
- the first divergence: the first position where they are not (what greedy decoding on
  the other side would have written differently first), None where they always agree.

Identical logits give KL exactly 0 (the same float64 operations on the same numbers) and
agreement 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.floating]


@dataclass(frozen=True, slots=True)
class Divergence:
    """The comparison of two sides' next-token distributions over the same positions."""

    positions: int
    kl_mean: float
    kl_p99: float
    kl_max: float
    #: the position (0 = the answer's first token) of the largest KL
    kl_max_at: int
    top1_agreement: float
    #: the first position whose most likely tokens differ (None: none)
    first_divergence: int | None
    #: KL at every position, for a view that shades the answer by it
    kl: tuple[float, ...]
    #: whether the most likely tokens agree, at every position
    agree: tuple[bool, ...]


def log_softmax(logits: Logits) -> npt.NDArray[np.float64]:
    """Row-wise log-softmax in float64, shifted by each row's maximum (no overflow)."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    result: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


def compare_logits(reference: Logits, other: Logits) -> Divergence:
    """`reference` and `other`: (positions, vocabulary) logits for the same tokens."""
    ref, oth = np.asarray(reference), np.asarray(other)
    if ref.shape != oth.shape or ref.ndim != 2 or ref.shape[0] == 0:
        raise ValueError(f"logits of shape {ref.shape} and {oth.shape}: not the same positions")
    lp, lq = log_softmax(ref), log_softmax(oth)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    # rounding can leave -1e-17 where the distributions agree: a divergence is never negative
    kl = np.maximum(kl, 0.0)
    return _figures(kl, ref.argmax(axis=-1) == oth.argmax(axis=-1))


def combine(parts: Sequence[Divergence]) -> Divergence:
    """The figures over every position of `parts` (several answers), in their order: the
    positions of the second part follow those of the first."""
    if not parts:
        raise ValueError("nothing to combine")
    kl = np.concatenate([np.asarray(p.kl, dtype=np.float64) for p in parts])
    agree = np.concatenate([np.asarray(p.agree, dtype=bool) for p in parts])
    return _figures(kl, agree)


def _figures(kl: npt.NDArray[np.float64], agree: npt.NDArray[np.bool_]) -> Divergence:
    at = int(kl.argmax())
    wrong = np.flatnonzero(~agree)
    return Divergence(
        positions=int(kl.shape[0]),
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        kl_max=float(kl[at]),
        kl_max_at=at,
        top1_agreement=float(agree.mean()),
        first_divergence=int(wrong[0]) if wrong.size else None,
        kl=tuple(float(v) for v in kl),
        agree=tuple(bool(v) for v in agree),
    )
