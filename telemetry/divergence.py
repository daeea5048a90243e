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

A server gives only each position's top k log-probabilities (vLLM's `prompt_logprobs`,
llama-server's `n_probs`: backends/remote/servers/forcing.py). `compare_top` compares those: the
KL over the tokens both sides list, each side's remaining mass in one "rest" bucket.
Merging tokens into one bucket never raises a KL, so this is a lower bound of the full
one; the top-1 agreement is exact (a top k holds its top 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    #: None: whole distributions compared; k: only each side's k most likely tokens
    #: (a server's), so every KL is a lower bound of the whole one
    top_k: int | None = None

    @property
    def bound(self) -> str:
        """ "" for whole distributions, else what the KL figures are (shown beside them)."""
        if self.top_k is None:
            return ""
        return f"KL over each side's top {self.top_k} (a lower bound)"


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


#: a log-probability for one position's listed tokens: token id -> log-probability
TopLogprobs = Mapping[int, float]
#: the smallest "rest" mass a side is given: a top k that lists (nearly) all of the mass
#: leaves ~0 for the rest, and a KL against 0 is infinite, not a measurement
REST_FLOOR = 1e-12


def compare_top(reference: Sequence[TopLogprobs], other: Sequence[TopLogprobs]) -> Divergence:
    """The figures from each position's top log-probabilities on both sides (the same
    positions, in order): KL(reference || other) over the tokens both sides list plus a
    bucket for the rest of each side's mass, and top-1 agreement from each side's most
    likely listed token."""
    if len(reference) != len(other) or not reference:
        raise ValueError(f"{len(reference)} and {len(other)} positions: not the same positions")
    kl, agree = [], []
    for a, b in zip(reference, other, strict=True):
        both = sorted(a.keys() & b.keys())
        pa = np.exp(np.array([a[t] for t in both], dtype=np.float64))
        pb = np.exp(np.array([b[t] for t in both], dtype=np.float64))
        pa = np.append(pa, max(1.0 - pa.sum(), REST_FLOOR))
        pb = np.append(pb, max(1.0 - pb.sum(), REST_FLOOR))
        kl.append(max(float((pa * np.log(pa / pb)).sum()), 0.0))
        agree.append(max(a, key=a.__getitem__) == max(b, key=b.__getitem__))
    # the fewest tokens any position lists: what "top k" means for these figures
    k = min(min(len(a), len(b)) for a, b in zip(reference, other, strict=True))
    return _figures(np.array(kl, dtype=np.float64), np.array(agree, dtype=bool), k)


def top_of_logits(logits: Logits, k: int) -> list[dict[int, float]]:
    """A local side's logits as a server gives them: each position's k most likely
    tokens and their log-probabilities (to compare it with `compare_top`)."""
    lp = log_softmax(logits)
    top = np.argsort(-lp, axis=-1, kind="stable")[:, :k]
    return [{int(t): float(row[t]) for t in ids} for row, ids in zip(lp, top, strict=True)]


def combine(parts: Sequence[Divergence]) -> Divergence:
    """The figures over every position of `parts` (several answers), in their order: the
    positions of the second part follow those of the first."""
    if not parts:
        raise ValueError("nothing to combine")
    kl = np.concatenate([np.asarray(p.kl, dtype=np.float64) for p in parts])
    agree = np.concatenate([np.asarray(p.agree, dtype=bool) for p in parts])
    bounds = [p.top_k for p in parts if p.top_k is not None]
    return _figures(kl, agree, min(bounds) if bounds else None)


def _figures(
    kl: npt.NDArray[np.float64], agree: npt.NDArray[np.bool_], top_k: int | None = None
) -> Divergence:
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
        top_k=top_k,
    )
