"""One side of a divergence as teacher forcing reads it, and the measurement of B
against A over A's answer, wherever each side runs.

- The model here (llama.cpp): every position's logits, the whole distribution
  (backends/local/teacher.py), read in a worker thread.
- A server whose family can (vLLM, llama-server: backends/remote/servers/forcing.py): each
  position's top k log-probabilities. Where either side is a server, both are compared
  over their top k (telemetry/divergence.py `compare_top`: the KL is a lower bound; the
  figures say so). Other servers (Ollama, OpenAI, ...) give no log-probabilities of
  tokens they did not sample: no divergence, and the reason.

Both sides read one sequence, A's (`Teaching`): the prompt's ids as A's template renders
it, then A's answer. The model here gives the ids it sampled; a server's answer comes as
text, split by the server's own tokenizer (`retokenized`: a sampler may have split it
otherwise; both sides still read the same tokens). Where the sides are not one model
file or one server, B must read A's ids as the same text (`vocabulary_check`): B
spells A's answer ids back, and both split a probe text alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from phasechat.backends.base import Backend
from phasechat.backends.events import AnswerTokens, Message
from phasechat.backends.local.capability import ModelFile, PromptIds
from phasechat.backends.local.gguf import vocabulary
from phasechat.backends.local.llama_logs import quiet_llama, verbose
from phasechat.backends.local.teacher import EngineSetting, forced_logits
from phasechat.backends.remote.capability import RemoteServer
from phasechat.backends.remote.servers.forcing import TOP_K, Forcing, Listed, Server, TeacherError
from phasechat.telemetry.divergence import (
    Divergence,
    Logits,
    compare_logits,
    compare_top,
    top_of_logits,
)

T = TypeVar("T")

#: split by both sides' tokenizers: the same ids, or not the same vocabulary (scripts,
#: digits, whitespace, code, an emoji)
PROBE = "Teacher forcing, checked: naïve café, 日本語, 한국어, 3.14159\n\tdef f(x): return x**2  🙂"


def vocabulary_differs(a: Path, b: Path) -> str | None:
    """Why A's token ids mean nothing to model `b` (None: the same vocabulary)."""
    if a == b:
        return None
    va, vb = vocabulary(a), vocabulary(b)
    if va and va == vb:
        return None
    return (
        f"the models' vocabularies differ ({a.name}: {va or 'none named'}; {b.name}: "
        f"{vb or 'none named'}): B would read A's tokens as other text, so no divergence "
        "is measured; the speed figures stand"
    )


@dataclass(frozen=True, slots=True)
class Forced:
    """What teacher forcing reads one side with: its model file and engine setting."""

    model: Path
    setting: EngineSetting


def forced_of(backend: Backend) -> Forced | None:
    """A local side's model file, its KV type, the flash attention it loaded with, its
    threads and GPU layers (a `LocalBackend`, or the same in a child process); None: a
    remote side, or a model not found. Its context size is not carried: one read of a
    sequence gives the same logits in any context that holds it (measured: KL exactly 0
    between 256, 2,048 and 4,096 cells, flash attention on and off)."""
    if not isinstance(backend, ModelFile) or not isinstance(path := backend.model_path, Path):
        return None
    kv_type, threads = backend.config.kv_type, backend.threads or None
    setting = EngineSetting(kv_type, backend.flash_attn, threads, gpu_layers=backend.gpu_layers)
    return Forced(path, setting)


async def prompt_ids(backend: Backend, messages: tuple[Message, ...]) -> list[int] | None:
    """The prompt's token ids as a local side's model reads them (None: a remote side,
    a model not loaded, a template that refuses the messages)."""
    if not isinstance(backend, PromptIds):
        return None
    return await backend.prompt_ids(messages)


def answer_divergence(
    a: Forced,
    b: Forced,
    prompt: Sequence[int],
    answer: Sequence[int],
    progress: Callable[[str, int, int], None] | None = None,
    stop: threading.Event | None = None,
    labels: tuple[str, str] = ("A", "B"),
) -> Divergence:
    """B's divergence from A over `answer` (A's answer token ids after `prompt`), each
    side reading the whole sequence once; blocking (run it in a thread).
    `progress(side, read, total)` as each side reads (`labels`: "A", then "B"); a set
    `stop` raises `Stopped` (backends/base.py). The caller has checked the vocabularies
    (`vocabulary_differs`)."""
    sequence, start = [*prompt, *answer], len(prompt)
    logits = []
    for label, side in zip(labels, (a, b), strict=True):
        told = None if progress is None else partial(progress, label)
        logits.append(forced_logits(side.model, side.setting, sequence, start, told, stop))
    return compare_logits(*logits)


@dataclass(frozen=True, slots=True)
class Reader:
    """How one side is read: the model here (`forced`) or a server (`forcing` on
    `server`); `name` says which, in a few words."""

    name: str
    forced: Forced | None = None
    forcing: Forcing | None = None
    server: Server | None = None

    @property
    def whole(self) -> bool:
        """Whether it gives whole distributions (the model here), not a top k."""
        return self.forced is not None


def reader_of(backend: Backend) -> Reader | None:
    """`backend` as teacher forcing reads it (None: `why_unread` says why)."""
    forced = forced_of(backend)
    if forced is not None:
        return Reader("llama.cpp here", forced=forced)
    if isinstance(backend, RemoteServer) and (said := backend.teacher()) is not None:
        forcing, server = said
        return Reader(backend.family.name, forcing=forcing, server=server)
    return None


def caveats(readers: Sequence[Reader | None]) -> list[str]:
    """What the figures cannot be, once per server among `readers` (shown with them)."""
    said = [r.forcing.cannot for r in readers if r is not None and r.forcing is not None]
    return list(dict.fromkeys(said))


def why_unread(backend: Backend) -> str:
    """Why `reader_of(backend)` is None, in one line."""
    if isinstance(backend, RemoteServer):
        if backend.family.forcing is None:
            return (
                f"{backend.family.name} gives no log-probabilities of tokens it did not "
                "sample (vLLM and llama-server do)"
            )
        return f"{backend.name} is not connected"
    return f"{backend.name}: its model file was not found"


@dataclass(frozen=True, slots=True)
class Teaching:
    """The sequence both sides read: A's prompt ids, then A's answer ids and each
    one's bytes; `retokenized`: the answer's ids are its text split by A's server."""

    prompt: tuple[int, ...]
    ids: tuple[int, ...]
    pieces: tuple[bytes, ...]
    retokenized: bool = False

    @property
    def text(self) -> str:
        return b"".join(self.pieces).decode("utf-8", "replace")


async def teaching(
    reader: Reader,
    backend: Backend,
    messages: tuple[Message, ...],
    text: str,
    tokens: AnswerTokens | None,
) -> Teaching:
    """A's sequence: `messages` through A's template, then A's answer (`tokens` where
    the model here sampled them, else `text` through A's server's tokenizer). Raises
    ValueError (TeacherError) with the reason when A cannot say."""
    if reader.forced is not None:
        if tokens is None or not tokens.ids:
            raise ValueError("A's answer has no token ids")
        prompt = await prompt_ids(backend, messages)
        if prompt is None:
            raise ValueError(
                "A's model did not read the prompt (not loaded, or refused by its template)"
            )
        return Teaching(tuple(prompt), tokens.ids, tokens.pieces)
    forcing, server = _remote(reader)
    if not text:
        raise ValueError("A's answer is empty")
    prompt = await forcing.prompt_tokens(server, messages)
    ids, pieces = await forcing.tokenize(server, text)
    return Teaching(tuple(prompt), tuple(ids), pieces, retokenized=True)


async def vocabulary_check(a: Reader, b: Reader, t: Teaching | None) -> str | None:
    """Why B would read A's ids as other text (None: the same vocabulary, as far as
    the model files, or the answer and a probe text, tell). Without A's sequence (`t`
    None) only what the model files say: asked before the sequence is made."""
    if a.forced is not None and b.forced is not None:
        return await asyncio.to_thread(vocabulary_differs, a.forced.model, b.forced.model)
    if t is None:
        return None
    if a.server is not None and b.server is not None and _same_server(a.server, b.server):
        return None
    spelled = await _text_of(b, t.ids)
    if spelled != t.text:
        return (
            f"B ({b.name}) reads A's answer ids as other text: not the same vocabulary, "
            "so no divergence is measured; the speed figures stand"
        )
    if await _ids_of(a, PROBE) != await _ids_of(b, PROBE):
        return (
            f"A ({a.name}) and B ({b.name}) split the same text into other ids: not the "
            "same vocabulary, so no divergence is measured; the speed figures stand"
        )
    return None


async def read(
    reader: Reader,
    t: Teaching,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> Logits | list[Listed]:
    """One side's distributions predicting `t`'s answer, read teacher-forced: the
    model's logits here (in a worker thread), a server's top k there."""
    sequence, start = [*t.prompt, *t.ids], len(t.prompt)
    if reader.forced is not None:
        forced = reader.forced
        return await asyncio.to_thread(
            forced_logits, forced.model, forced.setting, sequence, start, progress, stop
        )
    forcing, server = _remote(reader)
    return await forcing.top(server, sequence, start, progress, stop)


def compared(a: Logits | list[Listed], b: Logits | list[Listed]) -> Divergence:
    """B against A: whole distributions where both are, else each side's top k."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return compare_logits(a, b)
    listed = [top_of_logits(x, TOP_K) if isinstance(x, np.ndarray) else x for x in (a, b)]
    return compare_top(*listed)


async def measure(
    a: Reader,
    b: Reader,
    t: Teaching,
    progress: Callable[[str, int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> tuple[Divergence | None, str | None]:
    """B's divergence from A over `t`'s answer, or None and why not (another
    vocabulary, a server's refusal). `progress(side, read, total)` as each side reads;
    a set `stop` raises `Stopped` (backends/base.py)."""
    try:
        why = await vocabulary_check(a, b, t)
        if why is not None:
            return None, why
        if a.forced is not None and b.forced is not None:  # both here: one thread
            return await asyncio.to_thread(
                answer_divergence, a.forced, b.forced, t.prompt, t.ids, progress, stop
            ), None
        sides = []
        for label, reader in (("A", a), ("B", b)):
            told = None if progress is None else partial(progress, label)
            sides.append(await read(reader, t, told, stop))
        return compared(*sides), None
    except TeacherError as exc:
        return None, str(exc)


def floor(
    a: Reader,
    t: Teaching,
    progress: Callable[[str, int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> Divergence | None:
    """The engine's own floor for `t`: A's setting reading A's sequence one token a
    step (as decode reads) against the same setting reading it as a prefill does. The
    same tokens, weights and setting; only the order of the sums differs. A setting's
    divergence near this floor is not told apart from arithmetic (bench/README.md: on
    the bundled model about as large as a q8_0 KV cache's). None: A is not the model
    here. Blocking (run it in a thread); `progress` as `answer_divergence`'s, the
    one-token read labelled "A, a token a step"."""
    if a.forced is None:
        return None
    stepped = Forced(a.forced.model, replace(a.forced.setting, batch=1))
    labels = ("A", "A, a token a step")
    return answer_divergence(a.forced, stepped, t.prompt, t.ids, progress, stop, labels)


def _remote(reader: Reader) -> tuple[Forcing, Server]:
    assert reader.forcing is not None and reader.server is not None  # not the model here
    return reader.forcing, reader.server


def _same_server(a: Server, b: Server) -> bool:
    return a.root == b.root and a.model == b.model


async def _text_of(reader: Reader, ids: Sequence[int]) -> str:
    if reader.forced is not None:
        path = reader.forced.model
        said = await asyncio.to_thread(_local_vocab, path, lambda llm: llm.detokenize(list(ids)))
        return bytes(said).decode("utf-8", "replace")
    forcing, server = _remote(reader)
    return await forcing.detokenize(server, ids)


async def _ids_of(reader: Reader, text: str) -> list[int]:
    if reader.forced is not None:
        path = reader.forced.model
        return list(
            await asyncio.to_thread(
                _local_vocab, path, lambda llm: llm.tokenize(text.encode(), add_bos=False)
            )
        )
    forcing, server = _remote(reader)
    ids, _ = await forcing.tokenize(server, text)
    return ids


def _local_vocab(path: Path, use: Callable[[Any], T]) -> T:
    """`use(llm)` on the model's vocabulary alone (no weights: a fraction of a second)."""
    quiet_llama()
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=verbose())
    try:
        return use(llm)
    finally:
        llm.close()
