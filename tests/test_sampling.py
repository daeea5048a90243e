"""The candidates the sampler hands llama.cpp's chain (backends/sampling.py
`TopCandidates`): every one of the k largest logits, in ascending id order, and not many
more; checked against numpy's full sort on logits of known shape."""

from __future__ import annotations

import statistics

import numpy as np
import numpy.typing as npt
import pytest

from phasechat.backends.sampling import TopCandidates

N = 49_152
K = 40


def top_k(x: npt.NDArray[np.float32], k: int = K) -> set[int]:
    """The k largest logits' ids, by a full sort (the reference)."""
    return {int(i) for i in np.argsort(-x, kind="stable")[:k]}


def logits(seed: int, spread: float) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(N) * spread).astype(np.float32)


@pytest.mark.parametrize("spread", [0.5, 2.0, 6.0, 30.0])
def test_the_k_largest_are_always_in(spread: float) -> None:
    """Flat and peaked logits alike, and as the threshold learns over many tokens."""
    within = TopCandidates(K, N)
    for seed in range(40):
        x = logits(seed, spread)
        keep = within(x)
        assert top_k(x) <= {int(i) for i in keep}
        assert list(keep) == sorted(keep)  # llama.cpp's order: ascending ids


def test_a_peak_far_above_the_rest_widens_the_threshold() -> None:
    """One token 50 above the others: the first threshold (8 below it) holds one, so it
    widens until 40 are in."""
    x = logits(1, 1.0)
    x[1234] = 50.0
    within = TopCandidates(K, N)
    keep = within(x)
    assert top_k(x) <= {int(i) for i in keep}
    assert 1234 in keep
    assert within.below > 8.0


def test_it_narrows_after_the_first_token() -> None:
    """Flat logits put nearly all of the vocabulary within 8 of the largest: from the
    next token on, the threshold sits just under the k-th largest it saw, and a few
    hundred are kept (iid logits move their k-th largest more than a model's do)."""
    within = TopCandidates(K, N)
    sizes = [len(within(logits(seed, 1.0))) for seed in range(60)]
    assert sizes[0] > N // 2  # the first threshold is wide
    assert statistics.median(sizes[1:]) < N // 50
    assert min(sizes) >= K


def test_exactly_k_at_the_threshold_is_enough() -> None:
    """k tokens at the top, the rest far below: those k, nothing more."""
    x = np.full(N, -100.0, dtype=np.float32)
    x[:K] = np.linspace(0.0, 1.0, K, dtype=np.float32)
    keep = TopCandidates(K, N)(x)
    assert [int(i) for i in keep] == list(range(K))


def test_fewer_than_k_finite_logits_gives_all() -> None:
    """3 finite logits, the rest -inf (a banned vocabulary): every id, as llama.cpp
    would list them, never a loop that does not end."""
    x = np.full(N, -np.inf, dtype=np.float32)
    x[[5, 70, 900]] = [1.0, 2.0, 3.0]
    keep = TopCandidates(K, N)(x)
    assert len(keep) == N


def test_a_nan_gives_all() -> None:
    x = logits(2, 1.0)
    x[17] = np.nan
    assert len(TopCandidates(K, N)(x)) == N
