"""The token sampler (backends/local/sampling.py) on the real bundled model: greedy gives what
llama.cpp's own greedy sampler gives over the whole vocabulary, and a seed gives one
answer, the same each time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from phasechat.backends.events import AnswerTokens, GenerationRequest, Message, TextDelta
from phasechat.backends.local import sampling
from phasechat.backends.local.backend import LocalBackend

pytestmark = pytest.mark.model

QUESTION = Message("user", "Write a short story about a lighthouse keeper and a storm.")


async def answer(
    backend: LocalBackend,
    temp: float,
    seed: int | None,
    greedy: Callable[[Any], Callable[[], int]] | None = None,
) -> tuple[tuple[int, ...], str]:
    """The answer's token ids and text; with `greedy`, chosen by it instead."""
    request = GenerationRequest((QUESTION,), max_tokens=64, temperature=temp, seed=seed)
    saved = sampling.greedy
    if greedy is not None:
        sampling.greedy = greedy  # type: ignore[assignment]
    try:
        events = [e async for e in backend.stream(request)]
    finally:
        sampling.greedy = saved
    (ids,) = [e.ids for e in events if isinstance(e, AnswerTokens)]
    return ids, "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_greedy_is_llama_cpps_greedy(local_backend: LocalBackend) -> None:
    """numpy's argmax over the logits buffer against llama.cpp's greedy sampler over all
    n_vocab candidates. A first answer leaves the cache holding the prompt, so both
    compared runs read its last token again alone (the same logits, bit for bit, where
    a whole prompt's batch may round differently)."""
    await answer(local_backend, 0.0, None)
    theirs, their_text = await answer(local_backend, 0.0, None, lambda llm: sampling.chain(llm, 0))
    ours, our_text = await answer(local_backend, 0.0, None)
    assert len(ours) == 64  # the story runs past the limit: every step compared
    assert ours == theirs
    assert our_text == their_text


@pytest.mark.parametrize(("temp", "seed"), [(0.7, 1234), (1.5, 7)])
async def test_a_seed_gives_one_answer(local_backend: LocalBackend, temp: float, seed: int) -> None:
    """The same seed, the same answer; another seed, another (so the sampled path is
    not greedy in disguise)."""
    other, _ = await answer(local_backend, temp, seed + 1)  # first: the others read alike
    one, one_text = await answer(local_backend, temp, seed)
    again, again_text = await answer(local_backend, temp, seed)
    assert (one, one_text) == (again, again_text)
    assert other != one
    greedy, _ = await answer(local_backend, 0.0, None)
    assert one != greedy
