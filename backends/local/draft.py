"""Speculative decoding for the local backend (`draft=PATH` or `draft=lookup`): a draft
proposes the next few tokens, the model reads them all in one evaluation, and keeps
those it would have chosen itself, plus its own next choice.

llama-cpp-python takes a draft as a `LlamaDraftModel` (`Llama(draft_model=...)`), but
uses it only inside `Llama.generate`, which the local backend does not run (it drives
its own decode loop: llama_glue.token_loop). So the loop here is the greedy half of
`Llama.generate`'s speculation, and counts what it drafted and accepted (llama-cpp-python
counts neither). It only runs at temperature 0: greedy verification keeps exactly the
tokens the model would have written alone, so a draft changes the speed, never the
answer. Llama-cpp-python ships one draft, prompt lookup (`LlamaPromptLookupDecoding`:
n-grams of the text so far); `ModelDraft` is the other kind, a second, smaller model.

Imported once llama.cpp is loaded (backends/local/backend.py), as it subclasses its draft type.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

from phasechat.backends.events import ServerTimings
from phasechat.backends.local.gguf import GGUFError, vocabulary
from phasechat.backends.local.llama_glue import perf_counters, read_prompt, reuse_prefix, usable_ctx
from phasechat.backends.local.llama_logs import verbose

#: a draft model's proposals per step: a small model's guesses beyond a few tokens are
#: mostly rejected, and a rejected guess costs the model its share of a batch
DRAFT_TOKENS = 4


Counters = tuple[float, float, int, int]


@dataclass(slots=True)
class DraftCount:
    """Tokens drafted and accepted during one answer, and llama.cpp's counters and the
    clock once the prompt was read (None: not yet)."""

    drafted: int = 0
    accepted: int = 0
    read: Counters | None = None
    read_ns: int | None = None

    def timings(self, before: Counters, after: Counters, cached: int, made: int) -> ServerTimings:
        """The answer's timings in llama-server's shape. llama.cpp counts every batch of
        more than one token as prompt, so a speculative step's batch is counted there:
        the prompt is what was read before the first token; the decode is everything
        after (`made` tokens) by the clock, the draft's own work included (the model's
        counters leave out a draft model's context), as llama-server reports it."""
        read = self.read or after
        end = time.perf_counter_ns()
        return ServerTimings(
            prompt_n=read[2] - before[2],
            prompt_ms=read[0] - before[0],
            predicted_n=made,
            predicted_ms=(end - (self.read_ns or end)) / 1e6,
            cache_n=cached,
            draft_n=self.drafted,
            draft_n_accepted=self.accepted,
        )


class ModelDraft(LlamaDraftModel):
    """A second model on the draft GGUF, proposing `k` greedy tokens after the text so
    far. It keeps its own KV cache between calls: each call reads only what is new."""

    def __init__(
        self, path: Path, n_ctx: int, threads: int, gpu_layers: int, k: int = DRAFT_TOKENS
    ) -> None:
        import llama_cpp

        self.k = k
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            n_gpu_layers=gpu_layers,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=verbose(),
        )
        self._n_vocab = int(self.llm.n_vocab())

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        import llama_cpp.llama_cpp as lib

        llm, tokens = self.llm, [int(t) for t in input_ids]
        k = min(self.k, usable_ctx(llm) - len(tokens))
        out: list[int] = []
        if k <= 0:
            return np.array(out, dtype=np.intc)
        start = reuse_prefix(llm, tokens)
        if start < len(tokens):
            llm.eval(tokens[start:])
        for i in range(k):
            logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(llm.ctx, -1), (self._n_vocab,))
            out.append(int(logits.argmax()))
            if i + 1 < k:
                llm.eval(out[-1:])
        return np.array(out, dtype=np.intc)

    def close(self) -> None:
        """Free the draft model's context and weights."""
        self.llm.close()


def make_draft(
    path: Path | None, model: Path, n_ctx: int, threads: int, gpu_layers: int
) -> LlamaDraftModel:
    """The draft on GGUF file `path` for `model` (None: prompt lookup). Raises ValueError
    for a draft file whose vocabulary is not the model's (its token ids would be read
    as other tokens), GGUFError for one that is not a GGUF model."""
    if path is None:
        return LlamaPromptLookupDecoding()
    mine, theirs = vocabulary(model), vocabulary(path)
    if not theirs:
        raise GGUFError(f"draft {path.name}: the file names no vocabulary")
    if mine != theirs:
        raise ValueError(
            f"draft {path.name}: its vocabulary {theirs} is not the model's {mine} "
            "(a draft proposes token ids: they must mean the same text)"
        )
    return ModelDraft(path, n_ctx, threads, gpu_layers)


def speculative_loop(
    llm: Any,
    tokens: list[int],
    draft: LlamaDraftModel,
    count: DraftCount,
    on_prompt: Callable[[int, int], None],
    on_batch: Callable[[int], None],
) -> Generator[int, None, None]:
    """`token_loop` at temperature 0 with a draft: each step feeds the model its last
    token and the draft's proposals in one batch, with logits at every position; a
    proposal is kept while it is the model's own argmax after the tokens before it, and
    the model's argmax after the last kept one comes next. The answer is the one plain
    greedy decoding writes; `count` adds up what was drafted and accepted.

    As in `token_loop`, the token just yielded is not in the KV cache yet (the next step
    reads it), so `n_tokens` / `input_ids` stay Llama's record of the cache."""
    import llama_cpp.llama_cpp as lib

    read_prompt(llm, tokens, on_prompt, on_batch)
    count.read, count.read_ns = perf_counters(llm), time.perf_counter_ns()
    ctx, n_vocab, ids = llm.ctx, int(llm.n_vocab()), llm.input_ids
    room_max = min(usable_ctx(llm), int(llm.n_batch))

    def top(i: int) -> int:
        return int(np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, i), (n_vocab,)).argmax())

    token = top(-1)
    while True:
        yield token
        n = int(llm.n_tokens)
        ids[n] = token
        # the proposals fit the context and one batch beside the token read with them
        room = min(usable_ctx(llm) - n - 1, room_max - 1)
        proposals = [int(t) for t in draft(ids[: n + 1])][: max(room, 0)]
        batch = [token, *proposals]
        llm._batch.set_batch(batch=batch, n_past=n, logits_all=True)
        llm._ctx.decode(llm._batch)
        ids[n : n + len(batch)] = batch
        kept: list[int] = []
        for i in range(len(batch)):
            token = top(i)
            if i < len(proposals) and proposals[i] == token:
                kept.append(token)
                continue
            break
        count.drafted += len(proposals)
        count.accepted += len(kept)
        held = n + 1 + len(kept)
        if held < n + len(batch):  # the rejected proposals leave the cache
            llm._ctx.kv_cache_seq_rm(-1, held, -1)
        llm.n_tokens = held
        for j, kept_token in enumerate(kept):
            try:
                yield kept_token
            except GeneratorExit:
                # stopped here (a stop string, the token limit): the cache keeps what the
                # answer has but this token, as the plain loop leaves it, not the rest
                llm._ctx.kv_cache_seq_rm(-1, n + 1 + j, -1)
                llm.n_tokens = n + 1 + j
                raise
