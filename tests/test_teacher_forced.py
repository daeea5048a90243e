"""Issue 49, item 3: teacher forcing through the bundled model, as a user meets it
(backends/teacher.py `forced_logits`, chat/trips/forced_sides.py's local paths,
chat/trips/diverge.py's measured turns and floors).

The model reads its own greedy answer, so each row's top choice is the token that
follows: a row read one place off, or a row not read at all, shows. The figures are
held against `forced_logits` of the sides' own settings, read by the test, in the
direction B against A (KL(A||B) and KL(B||A) differ for these settings)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from phasechat.backends.base import Stopped
from phasechat.backends.events import (
    AnswerTokens,
    Event,
    Finished,
    GenerationRequest,
    Message,
    TextDelta,
)
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.gguf import KV_TYPE_NAMES
from phasechat.backends.local.llama_logs import verbose
from phasechat.backends.local.models import default_model_path
from phasechat.backends.local.teacher import BATCH, EngineSetting, forced_logits
from phasechat.backends.remote.servers.forcing import TOP_K, Forcing, Listed, Server
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import Side
from phasechat.chat.trips.diverge import Turn, diverge, overall, overall_floor
from phasechat.chat.trips.forced_sides import (
    Forced,
    Reader,
    Teaching,
    answer_divergence,
    floor,
    measure,
    vocabulary_check,
)
from phasechat.telemetry.divergence import Divergence, compare_logits, top_of_logits
from tests.scripted import ScriptedBackend
from tests.shaped import Shaped, chunk, sse

pytestmark = pytest.mark.model

PROMPT = "The capital of France is Paris. The capital of Italy is"
#: one thread: llama.cpp's threads spin-wait, and the machine is shared
THREADS = 1
#: the answer's length: long enough for batches of 2 to end on a part batch
ANSWER = 6


#: the bundled model's vocabulary, loaded once for the module (`vocab`)
_VOCAB: list[Any] = []


def vocab() -> Any:
    if not _VOCAB:
        import llama_cpp

        path = str(default_model_path())
        _VOCAB.append(llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False))
    return _VOCAB[0]


@pytest.fixture(autouse=True, scope="module")
def _vocab_closed() -> Iterator[None]:
    """The vocabulary is closed with the module, not left to `Llama.__del__` at the
    interpreter's exit, when llama_cpp's module globals are gone already (a TypeError
    printed at the end of every run)."""
    yield
    while _VOCAB:
        _VOCAB.pop().close()


def ids_of(text: str, bos: bool) -> list[int]:
    return list(vocab().tokenize(text.encode(), add_bos=bos))


def piece(i: int) -> bytes:
    return bytes(vocab().detokenize([i]))


def prompt_of(messages: Sequence[Message]) -> list[int]:
    """A chat's prompt ids, as a template would make them from each message."""
    return ids_of("".join(f"{m.role}: {m.content}\n" for m in messages), True)


@cache
def greedy(prompt: tuple[int, ...], n: int = ANSWER) -> tuple[int, ...]:
    """The model's own greedy answer to `prompt`, each token read with all before it."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(default_model_path()),
        n_ctx=256,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        verbose=False,
    )
    try:
        seq = list(prompt)
        for _ in range(n):
            llm.reset()
            llm.eval(seq)
            seq.append(int(np.argmax(llm.scores[len(seq) - 1])))
        return tuple(seq[len(prompt) :])
    finally:
        llm.close()


def sequence() -> tuple[list[int], int]:
    prompt = ids_of(PROMPT, True)
    return [*prompt, *greedy(tuple(prompt))], len(prompt)


# -- backends/teacher.py ------------------------------------------------------------


def test_each_row_predicts_the_token_after_it(model_path: Path) -> None:
    """Row i is read from the tokens before answer token i: the greedy answer is each
    row's top choice, at the first possible start, the usual one and the last one."""
    tokens, start = sequence()
    n_vocab = vocab().n_vocab()
    for at in (1, start, len(tokens) - 1):
        logits = forced_logits(model_path, EngineSetting(threads=THREADS), tokens, at)
        assert logits.shape == (len(tokens) - at, n_vocab) and logits.dtype == np.float32
        # the answer's rows: the model's own greedy choices
        top = [int(t) for t in np.argmax(logits, axis=1)]
        shown = min(ANSWER, len(top))
        assert top[-shown:] == list(tokens[-shown:])
    for at in (0, len(tokens)):  # one past each bound: no token before, or none to predict
        with pytest.raises(ValueError, match=f"the answer starts at {at} of {len(tokens)} tokens"):
            forced_logits(model_path, EngineSetting(threads=THREADS), tokens, at)


def test_a_batch_at_a_time_reports_each_and_reads_the_same_answer(model_path: Path) -> None:
    """batch=2 reads the sequence 2 tokens a step (the last step shorter, where the
    tokens read are odd in number), reporting each; the same greedy choices, the same
    shape. A set `stop` ends the reading at the next step."""
    tokens, start = sequence()
    read = len(tokens) - 1
    seen: list[tuple[int, int]] = []
    two = EngineSetting(threads=THREADS, batch=2)
    logits = forced_logits(model_path, two, tokens, start, lambda *p: seen.append(p))
    assert seen == [(min(i, read), read) for i in range(2, read + 2, 2)]
    assert [int(t) for t in np.argmax(logits, axis=1)] == list(tokens[start:])
    whole = forced_logits(model_path, EngineSetting(threads=THREADS), tokens, start)
    assert logits.shape == whole.shape
    # another order of sums: near, not the same figures (the engine's floor)
    assert np.allclose(logits, whole, atol=0.05)

    stop = threading.Event()
    reported: list[int] = []

    def progress(done: int, total: int) -> None:
        reported.append(done)
        stop.set()  # Esc pressed while the first step was read

    with pytest.raises(Stopped):
        forced_logits(model_path, two, tokens, start, progress, stop)
    assert reported == [2]
    with pytest.raises(Stopped):  # set before: nothing read
        forced_logits(model_path, two, tokens, start, progress, stop)
    assert reported == [2]


def llama_loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each `llama_cpp.Llama` made from now on (each still
    made, by the real one)."""
    import llama_cpp

    asked: list[dict[str, Any]] = []
    real = llama_cpp.Llama.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        asked.append(kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(llama_cpp.Llama, "__init__", spy)
    return asked


def test_llama_cpp_is_asked_for_the_sides_own_setting(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each setting reaches llama.cpp: the KV type of K and V, flash attention (on for
    a quantized cache when not said, off for f16), the threads, the batch, the GPU
    layers, every position's logits."""
    tokens, start = sequence()  # the vocabulary it reads is loaded before the spy
    asked = llama_loads(monkeypatch)
    settings = (
        EngineSetting(threads=THREADS),
        EngineSetting(kv="q8_0", threads=1, batch=3),
        EngineSetting(kv="f16", flash_attn=True, threads=THREADS, batch=BATCH),
        EngineSetting(kv="q4_0", flash_attn=True),
    )
    for setting in settings:
        forced_logits(model_path, setting, tokens, start)
    wanted = [
        (False, "f16", THREADS, BATCH),
        (True, "q8_0", 1, 3),
        (True, "f16", THREADS, BATCH),
        (True, "q4_0", None, BATCH),
    ]
    for kw, (flash, kv, threads, batch) in zip(asked, wanted, strict=True):
        assert kw["model_path"] == str(model_path)
        assert (kw["flash_attn"], kw["type_k"], kw["type_v"]) == (
            flash,
            KV_TYPE_NAMES[kv],
            KV_TYPE_NAMES[kv],
        )
        assert (kw["n_threads"], kw["n_threads_batch"], kw["n_batch"]) == (threads, threads, batch)
        assert (kw["n_gpu_layers"], kw["logits_all"], kw["n_ctx"]) == (0, True, 256)
        assert kw["verbose"] is verbose()


def test_an_f16_cache_may_turn_flash_attention_off_and_a_quantized_one_may_not() -> None:
    assert EngineSetting("f16", flash_attn=False).label == "kv=f16 flash_attn=off"
    assert EngineSetting("q8_0").label == "kv=q8_0"  # flash attention: llama.cpp's choice
    with pytest.raises(ValueError, match="kv=q8_0 needs flash attention"):
        EngineSetting("q8_0", flash_attn=False)


# -- chat/trips/forced_sides.py and chat/trips/diverge.py ----------------------------


def logits_of(setting: EngineSetting, prompt: Sequence[int], answer: Sequence[int]) -> Any:
    return forced_logits(default_model_path(), setting, [*prompt, *answer], len(prompt))


class Here(ScriptedBackend):
    """The bundled model as a side teacher forcing reads (its file and a local config),
    whose answer is the model's own greedy answer, with its token ids."""

    def __init__(self, name: str, kv: str = "f16") -> None:
        super().__init__(name)
        self.model_path = default_model_path()
        self.config = LocalConfig(model_path=self.model_path, kv_type=kv)
        self.flash_attn: bool | None = None
        self.threads = THREADS
        self.gpu_layers = 0

    async def prompt_ids(self, messages: tuple[Message, ...]) -> list[int]:
        return prompt_of(messages)

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        ids = greedy(tuple(prompt_of(request.messages)))
        pieces = tuple(piece(i) for i in ids)
        for p in pieces:
            yield TextDelta(p.decode("utf-8", "replace"))
        yield AnswerTokens(ids, pieces, str(self.model_path))
        yield Finished("stop")


TURNS = (
    (Message("user", "The capital of France is"),),
    (
        Message("user", "The capital of France is"),
        Message("assistant", " Paris."),
        Message("user", "And of Italy?"),
    ),
)


def run(a: object, b: object, with_floor: bool | None = None) -> list[Turn]:
    settings = Settings(max_tokens=ANSWER, temperature=0)
    sa, sb = Side("a", a, settings), Side("b", b, settings)  # type: ignore[arg-type]
    if with_floor is None:
        return asyncio.run(diverge(sa, sb, TURNS))
    return asyncio.run(diverge(sa, sb, TURNS, with_floor=with_floor))


def test_two_settings_here_are_measured_b_against_a_turn_by_turn() -> None:
    """A at f16, B at q4_0: each turn's divergence is KL(A||B) of the two settings'
    logits over A's answer (not KL(B||A)), over the sequence A's template made; the
    turns numbered from 1, each with both answers; no floor unless asked."""
    turns = run(Here("a"), Here("b", kv="q4_0"))
    a, b = EngineSetting(threads=THREADS), EngineSetting(kv="q4_0", threads=THREADS)
    assert [t.number for t in turns] == [1, 2]
    for t, messages in zip(turns, TURNS, strict=True):
        prompt, answer = prompt_of(messages), greedy(tuple(prompt_of(messages)))
        assert t.why is None and t.floor is None
        assert t.taught == Teaching(tuple(prompt), answer, tuple(piece(i) for i in answer))
        assert (t.a.side, t.b.side) == (0, 1) and t.a.text == t.taught.text == t.b.text
        la, lb = logits_of(a, prompt, answer), logits_of(b, prompt, answer)
        want, back = compare_logits(la, lb), compare_logits(lb, la)
        assert t.divergence is not None and t.divergence.positions == ANSWER
        assert t.divergence.kl == pytest.approx(want.kl, rel=1e-6)
        assert t.divergence.kl != pytest.approx(back.kl, rel=1e-3)  # the direction shows
        assert t.divergence.top_k is None  # whole distributions here
    whole = overall(turns)
    assert whole is not None and whole.positions == 2 * ANSWER
    assert overall_floor(turns) is None
    assert all(t.floor is None for t in run(Here("a"), Here("b"), with_floor=False))


def test_the_floor_is_a_read_a_token_a_step_against_a_prefill() -> None:
    """With the floor asked: A's setting reading A's sequence one token a step against
    the same setting reading it as a prefill, on every turn; the same setting on both
    sides: KL exactly 0 and every top choice the same."""
    turns = run(Here("a"), Here("b"), with_floor=True)
    for t, messages in zip(turns, TURNS, strict=True):
        prompt, answer = prompt_of(messages), greedy(tuple(prompt_of(messages)))
        assert t.divergence is not None and t.why is None
        assert (t.divergence.kl_max, t.divergence.top1_agreement) == (0.0, 1.0)
        prefill = logits_of(EngineSetting(threads=THREADS), prompt, answer)
        stepped = logits_of(EngineSetting(threads=THREADS, batch=1), prompt, answer)
        assert t.floor is not None and t.floor.positions == ANSWER
        assert t.floor.kl == pytest.approx(compare_logits(prefill, stepped).kl, rel=1e-6)
        assert t.floor.kl_max > 0  # another order of sums: not the same figures
    below = overall_floor(turns)
    assert below is not None and below.positions == 2 * ANSWER


def here_reader(kv: str = "f16", batch: int = BATCH) -> Reader:
    setting = EngineSetting(kv=kv, threads=THREADS, batch=batch)
    return Reader("llama.cpp here", forced=Forced(default_model_path(), setting))


def taught() -> Teaching:
    prompt = prompt_of(TURNS[0])
    answer = greedy(tuple(prompt))
    return Teaching(tuple(prompt), answer, tuple(piece(i) for i in answer))


def test_both_sides_here_report_their_reading_by_label_and_the_floor_by_its_own() -> None:
    t = taught()
    seen: list[tuple[str, int, int]] = []
    d, why = asyncio.run(measure(here_reader(), here_reader("q8_0"), t, lambda *p: seen.append(p)))
    assert why is None and d is not None and d.positions == ANSWER
    read = len(t.prompt) + ANSWER - 1
    assert seen == [("A", read, read), ("B", read, read)]
    seen.clear()
    below = floor(here_reader(), t, lambda *p: seen.append(p))
    assert below is not None and below.positions == ANSWER
    assert seen[0] == ("A", read, read)
    assert seen[1:] == [("A, a token a step", i, read) for i in range(1, read + 1)]
    # a stop asked before: neither side is read
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        answer_divergence(here_reader().forced, here_reader().forced, t.prompt, t.ids, stop=stop)  # type: ignore[arg-type]


def served_here() -> Forcing:
    """A server of the bundled model with the setting `here_reader()` reads: its top k
    of the same logits, its tokenizer the model's own."""

    async def top(
        server: Server, tokens: Sequence[int], start: int, progress: Any, stop: Any
    ) -> list[Listed]:
        setting = EngineSetting(threads=THREADS)
        logits = forced_logits(default_model_path(), setting, tokens, start, progress, stop)
        return top_of_logits(logits, TOP_K)

    async def tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
        ids = ids_of(text, False)
        return ids, tuple(piece(i) for i in ids)

    async def detokenize(server: Server, ids: Sequence[int]) -> str:
        return bytes(vocab().detokenize(list(ids))).decode("utf-8", "replace")

    async def prompt_tokens(server: Server, messages: tuple[Message, ...]) -> list[int]:
        return prompt_of(messages)

    return Forcing(top, tokenize, detokenize, prompt_tokens, "over its top 20")


def server_reader(forcing: Forcing) -> Reader:
    server = Server(httpx.AsyncClient(), "http://127.0.0.1:1/v1", {}, "m")
    return Reader("served", forcing=forcing, server=server)


def test_the_model_here_against_a_server_of_it_reads_the_same_ids_and_text(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The model here and a server of the same model: A's ids spelled by B's
    vocabulary are A's text, and the probe splits alike, so the divergence is measured
    (over the top k, KL 0: the same logits); a server that spells or splits otherwise
    is another vocabulary, either way round. The model's vocabulary is read quietly
    (llama.cpp's load lines would land on the terminal under the TUI)."""
    t = taught()
    served = served_here()
    for a, b in ((here_reader(), server_reader(served)), (server_reader(served), here_reader())):
        capfd.readouterr()
        assert asyncio.run(vocabulary_check(a, b, t)) is None
        assert capfd.readouterr().err == ""
        d, why = asyncio.run(measure(a, b, t))
        assert why is None and d is not None
        assert (d.positions, d.top_k, d.kl_max, d.top1_agreement) == (ANSWER, TOP_K, 0.0, 1.0)

    async def other_text(server: Server, ids: Sequence[int]) -> str:
        return "another text"

    async def other_ids(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
        ids = [i + 1 for i in ids_of(text, False)]
        return ids, tuple(piece(i) for i in ids)

    spells = server_reader(dataclasses.replace(served, detokenize=other_text))
    why = asyncio.run(vocabulary_check(here_reader(), spells, t))
    assert why is not None and "B (served) reads A's answer ids as other text" in why
    splits = server_reader(dataclasses.replace(served, tokenize=other_ids))
    why = asyncio.run(vocabulary_check(splits, here_reader(), t))
    assert why is not None and "split the same text into other ids" in why
    # an answer cut inside a character (max_tokens): its bytes are not UTF-8, and B's
    # spelling of them is read as A's text is, the broken character replaced alike
    ids = ids_of(" 日本語", False)[:-1]
    cut = Teaching((1,), tuple(ids), tuple(piece(i) for i in ids), retokenized=True)
    with pytest.raises(UnicodeDecodeError):
        b"".join(cut.pieces).decode()
    assert asyncio.run(vocabulary_check(server_reader(served), here_reader(), cut)) is None


def served_backend() -> Any:
    """A real RemoteBackend on a scripted wire that answers the model's greedy text,
    whose family reads teacher-forced as `served_here()`."""

    def reply(body: dict[str, Any]) -> bytes:
        messages = tuple(Message(m["role"], m["content"]) for m in body["messages"])
        text = b"".join(piece(i) for i in greedy(tuple(prompt_of(messages)))).decode()
        return sse(chunk(text), chunk(finish="stop"))

    models = [{"id": "m", "object": "model", "owned_by": "llamacpp"}]
    backend = Shaped(models, reply).backend(model="m")
    asyncio.run(backend.start())
    backend.family = dataclasses.replace(backend.family, name="served", forcing=served_here())
    return backend


def test_a_server_as_a_gives_its_text_split_by_its_tokenizer() -> None:
    """A a server of the model, B the model here: A's answer is its text split by A's
    tokenizer (retokenized), after A's own prompt ids; B reads those ids; the same
    model and setting: KL 0 over the top k on every turn."""
    turns = run(served_backend(), Here("b"))
    for t, messages in zip(turns, TURNS, strict=True):
        prompt = prompt_of(messages)
        answer = greedy(tuple(prompt))
        assert t.why is None, t.why
        text = b"".join(piece(i) for i in answer).decode()
        # A's text split again by A's tokenizer (" \n" one token here, where the
        # sampler made two)
        ids = tuple(ids_of(text, False))
        assert t.taught == Teaching(tuple(prompt), ids, tuple(piece(i) for i in ids), True)
        d = t.divergence
        assert d is not None and (d.positions, d.top_k, d.kl_max) == (len(ids), TOP_K, 0.0)
    d = overall(turns)
    read = [len(t.taught.ids) for t in turns if t.taught is not None]
    assert isinstance(d, Divergence) and d.positions == sum(read) and len(read) == 2


def test_each_pair_of_sides_reports_by_label_and_stops_when_asked() -> None:
    """Wherever each side runs, its reading is reported under its own label, a set
    stop ends the measurement, and a server that spells A's ids otherwise is another
    vocabulary (asked with A's sequence, not without it)."""
    t = taught()
    read = len(t.prompt) + ANSWER - 1
    served = served_here()
    pairs = (
        (here_reader(), here_reader()),
        (here_reader(), server_reader(served)),
        (server_reader(served), here_reader()),
    )
    seen: list[tuple[str, int, int]] = []
    for a, b in pairs:
        seen.clear()
        d, why = asyncio.run(measure(a, b, t, lambda *p: seen.append(p)))
        assert why is None and d is not None and d.positions == ANSWER
        assert seen == [("A", read, read), ("B", read, read)]
        stop = threading.Event()
        stop.set()
        with pytest.raises(Stopped):
            asyncio.run(measure(a, b, t, stop=stop))

    async def other_text(server: Server, ids: Sequence[int]) -> str:
        return "another text"

    spells = server_reader(dataclasses.replace(served, detokenize=other_text))
    d, why = asyncio.run(measure(here_reader(), spells, t))
    assert d is None and why is not None and "reads A's answer ids as other text" in why


def test_a_reason_found_while_measuring_is_the_turns_own() -> None:
    """B a server whose vocabulary only A's sequence shows to differ (it spells A's
    ids otherwise): each turn keeps A's sequence and says why it has no divergence."""

    async def other_text(server: Server, ids: Sequence[int]) -> str:
        return "another text"

    b = served_backend()
    b.family = dataclasses.replace(
        b.family, forcing=dataclasses.replace(served_here(), detokenize=other_text)
    )
    turns = run(Here("a"), b)
    why = (
        "B (served) reads A's answer ids as other text: not the same vocabulary, so no "
        "divergence is measured; the speed figures stand"
    )
    assert [(t.number, t.divergence, t.why) for t in turns] == [(1, None, why), (2, None, why)]
    assert all(t.taught is not None and not t.taught.retokenized for t in turns)


def test_a_vocabulary_here_is_read_without_the_model_s_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spelling A's ids and splitting the probe on the model here loads its vocabulary
    alone (a fraction of a second), never its weights (the whole model, again, for
    each check), and quietly."""
    ids = tuple(ids_of(" Paris", False))
    t = Teaching((1,), ids, tuple(piece(i) for i in ids), retokenized=True)
    loads = llama_loads(monkeypatch)
    assert asyncio.run(vocabulary_check(server_reader(served_here()), here_reader(), t)) is None
    assert [(k["model_path"], k["vocab_only"], k["verbose"]) for k in loads] == [
        (str(default_model_path()), True, verbose())
    ] * 2  # A's ids spelled, then the probe split
