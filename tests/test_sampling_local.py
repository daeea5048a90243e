"""The token sampler (backends/sampling.py) on the real bundled model: the same answers
as llama.cpp's own sampling over the whole vocabulary, greedy and seeded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from phasechat.backends import sampling
from phasechat.backends.events import AnswerTokens, GenerationRequest, Message, TextDelta
from phasechat.backends.local import LocalBackend

pytestmark = pytest.mark.model

QUESTION = Message("user", "Write a short story about a lighthouse keeper and a storm.")
Factory = Callable[[Any, float], Callable[[], int]]


def greedy_chain(llm: Any, temp: float) -> Callable[[], int]:
    """llama.cpp's greedy sampler over all n_vocab logits (the reference for argmax)."""
    assert temp == 0.0
    return sampling.full_chain(llm, 0.0)


async def answer(
    backend: LocalBackend, temp: float, seed: int | None, factory: Factory | None = None
) -> tuple[tuple[int, ...], str]:
    """The answer's token ids and text; with `factory`, sampled by it instead."""
    request = GenerationRequest((QUESTION,), max_tokens=64, temperature=temp, seed=seed)
    saved = sampling.sampled, sampling.greedy
    if factory is not None:
        sampling.sampled = factory  # type: ignore[assignment]
        sampling.greedy = lambda llm: factory(llm, 0.0)
    try:
        events = [e async for e in backend.stream(request)]
    finally:
        sampling.sampled, sampling.greedy = saved
    (ids,) = [e.ids for e in events if isinstance(e, AnswerTokens)]
    return ids, "".join(e.text for e in events if isinstance(e, TextDelta))


async def same_as(
    backend: LocalBackend, temp: float, seed: int | None, reference: Factory
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ours, the reference's) token ids for one request. Ours runs first and is not
    compared: it leaves the cache holding the prompt, so the reference and our second
    run both read its last token again alone (the same logits, bit for bit, where a
    whole prompt's batch may round differently)."""
    await answer(backend, temp, seed)
    theirs, their_text = await answer(backend, temp, seed, reference)
    ours, our_text = await answer(backend, temp, seed)
    assert our_text == their_text
    return ours, theirs


async def test_greedy_is_llama_cpps_greedy(local_backend: LocalBackend) -> None:
    ours, theirs = await same_as(local_backend, 0.0, None, greedy_chain)
    assert len(ours) == 64  # the story runs past the limit: every step compared
    assert ours == theirs


@pytest.mark.parametrize(("temp", "seed"), [(0.7, 1), (0.7, 1234), (1.5, 7)])
async def test_seeded_sampling_is_llama_cpps_chain(
    local_backend: LocalBackend, temp: float, seed: int
) -> None:
    """The chain fed the top-k candidates draws what it draws over all n_vocab."""
    ours, theirs = await same_as(local_backend, temp, seed, sampling.full_chain)
    assert len(ours) >= 16
    assert ours == theirs


async def test_a_seed_picks_the_answer(local_backend: LocalBackend) -> None:
    """Another seed draws another answer: the comparisons above are not between two
    greedy runs."""
    other, _ = await answer(local_backend, 1.5, 8)  # first: the others read the cache alike
    one, _ = await answer(local_backend, 1.5, 7)
    again, _ = await answer(local_backend, 1.5, 7)
    assert one == again
    assert other != one
