"""Issue 49: the divergence's small slips, each with inputs that tell it apart from its
neighbour: asymmetric distributions (KL(A||B) is not KL(B||A)), two sides whose labels
differ, numbers at each bound and one past it (chat/trips/diverge.py,
chat/trips/forced_sides.py, backends/local/teacher.py, telemetry/divergence.py `combine`,
backends/remote/servers/forcing.py's checks)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from phasechat.backends.events import (
    AnswerTokens,
    Event,
    GenerationRequest,
    Message,
    StreamError,
)
from phasechat.backends.local.backend import LocalConfig
from phasechat.backends.local.gguf import KV_TYPE_NAMES
from phasechat.backends.local.teacher import BATCH, EngineSetting, forced_logits
from phasechat.backends.remote.servers.forcing import Forcing, Listed, Server, TeacherError
from phasechat.backends.remote.servers.llama_server.teacher import LLAMA_SERVER_FORCING
from phasechat.backends.remote.servers.vllm.teacher import vllm_top
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trips.compare import Side
from phasechat.chat.trips.diverge import Turn, chat_turns, diverge, overall, overall_floor
from phasechat.chat.trips.forced_sides import (
    PROBE,
    Forced,
    Reader,
    Teaching,
    caveats,
    compared,
    floor,
    forced_of,
    measure,
    reader_of,
    teaching,
    vocabulary_check,
    vocabulary_differs,
)
from phasechat.telemetry.divergence import Divergence, combine, compare_logits, compare_top
from tests.scripted import ScriptedBackend
from tests.test_engine_variants import tiny_gguf

# Two asymmetric distributions over three tokens: KL(A||B) and KL(B||A) differ.
A_P = (0.7, 0.2, 0.1)
B_P = (0.4, 0.5, 0.1)
KL_AB = sum(p * math.log(p / q) for p, q in zip(A_P, B_P, strict=True))
KL_BA = sum(q * math.log(q / p) for p, q in zip(A_P, B_P, strict=True))


def listed(ps: Sequence[float]) -> Listed:
    return {i: math.log(p) for i, p in enumerate(ps)}


def test_the_two_directions_differ_for_these_inputs() -> None:
    assert (round(KL_AB, 4), round(KL_BA, 4)) == (0.2085, 0.2343)


def test_a_server_side_is_compared_as_kl_of_a_against_b() -> None:
    # both servers (top k); the model here against a server (its logits made a top k)
    assert compared([listed(A_P)], [listed(B_P)]).kl[0] == pytest.approx(KL_AB)
    logits = np.log(np.array([A_P]))
    assert compared(logits, [listed(B_P)]).kl[0] == pytest.approx(KL_AB)
    assert compared([listed(B_P)], logits).kl[0] == pytest.approx(KL_BA)
    assert compared(logits, np.log(np.array([B_P]))).kl[0] == pytest.approx(KL_AB)


def forcing_of(tops: dict[str, list[Listed]]) -> Forcing:
    """A Forcing whose servers (by model name) list `tops`, and spell and split alike."""

    async def top(server: Server, *_: Any) -> list[Listed]:
        return tops[server.model]

    async def tokenize(server: Server, text: str) -> tuple[list[int], tuple[bytes, ...]]:
        return [*text.encode()], tuple(bytes([b]) for b in text.encode())

    async def detokenize(server: Server, ids: Sequence[int]) -> str:
        return bytes(ids).decode()

    async def prompt_tokens(server: Server, messages: tuple[Message, ...]) -> list[int]:
        return [1]

    return Forcing(top, tokenize, detokenize, prompt_tokens, "a lower bound")


def test_measure_between_two_servers_is_kl_of_a_against_b() -> None:
    forcing = forcing_of({"a": [listed(A_P)], "b": [listed(B_P)]})
    client = httpx.AsyncClient()
    a = Reader("A", forcing=forcing, server=Server(client, "http://one:1/v1", {}, "a"))
    b = Reader("B", forcing=forcing, server=Server(client, "http://two:2/v1", {}, "b"))
    t = Teaching((1,), (104,), (b"h",), retokenized=True)
    d, why = asyncio.run(measure(a, b, t))
    assert why is None and d is not None
    assert d.kl[0] == pytest.approx(KL_AB) and d.top_k == 3
    back, _ = asyncio.run(measure(b, a, t))
    assert back is not None and back.kl[0] == pytest.approx(KL_BA)


def test_two_models_behind_one_url_are_checked_for_their_vocabulary() -> None:
    answer = Teaching((1, 2), (5, 6), (b"Hi", b" there"))
    probe = list(range(len(PROBE.encode())))

    def reply(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/detokenize":
            return httpx.Response(200, json={"content": "other text"})
        text = json.loads(request.content)["content"].encode()
        pieces = [{"id": i, "piece": [c]} for i, c in zip(probe, text, strict=False)]
        return httpx.Response(200, json={"tokens": pieces})

    async def check(model_b: str) -> str | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
            url = "http://127.0.0.1:8000/v1"
            a = Reader("A", forcing=LLAMA_SERVER_FORCING, server=Server(client, url, {}, "one"))
            b = Reader("B", forcing=LLAMA_SERVER_FORCING, server=Server(client, url, {}, model_b))
            return await vocabulary_check(a, b, answer)

    # one server, one model: nothing to check; another model behind the same URL: checked
    assert asyncio.run(check("one")) is None
    why = asyncio.run(check("two"))
    assert why is not None and "reads A's answer ids as other text" in why


def test_two_model_files_that_name_no_vocabulary_are_not_one(tmp_path: Path) -> None:
    a = tiny_gguf(tmp_path / "a.gguf", [])
    b = tiny_gguf(tmp_path / "b.gguf", [])
    why = vocabulary_differs(a, b)
    assert why is not None and "none named" in why
    assert vocabulary_differs(a, a) is None  # one file: one vocabulary, named or not


def div(kl: Sequence[float], top_k: int | None = None) -> Divergence:
    d = compare_logits(np.zeros((len(kl), 2)), np.zeros((len(kl), 2)))
    return dataclasses.replace(d, kl=tuple(kl), top_k=top_k)


def test_a_combined_bound_is_the_smallest_top_k() -> None:
    both = combine([div([0.1], 20), div([0.2], 5), div([0.3])])
    assert both.top_k == 5 and "top 5 " in both.bound
    assert combine([div([0.1]), div([0.2])]).top_k is None


def test_a_log_probability_of_exactly_zero_is_one_and_believed() -> None:
    async def read(entry: Any) -> list[Listed]:
        body = {"choices": [{"prompt_logprobs": [None, entry]}]}

        def reply(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json=body)

        async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
            return await vllm_top(Server(client, "http://x/v1", {}, "m"), [1, 2], 1)

    assert asyncio.run(read({"7": {"logprob": 0.0}})) == [{7: 0.0}]
    assert asyncio.run(read({"7": {"logprob": -0.0}})) == [{7: 0.0}]
    assert compare_top([{7: 0.0}], [{7: 0.0}]).kl == (0.0,)


def test_an_all_gpu_setting_is_labelled_with_its_layers() -> None:
    assert EngineSetting(gpu_layers=-1).label == "kv=f16 gpu_layers=-1"
    assert EngineSetting(gpu_layers=3).label == "kv=f16 gpu_layers=3"
    assert EngineSetting().label == "kv=f16"  # the CPU


def refused_as(words: str) -> pytest.RaisesExc[ValueError]:
    """A ValueError whose message is exactly `words`."""
    return pytest.raises(ValueError, match=f"^{re.escape(words)}$")


def test_a_bad_setting_is_refused_in_words_that_name_it_and_what_is_allowed() -> None:
    # the words a user reads (compare's --kv and --batch are checked here); each bound
    # and one past it
    with refused_as(f"kv='q5': one of {', '.join(KV_TYPE_NAMES)}"):
        EngineSetting("q5")
    with refused_as("kv=q8_0 needs flash attention (llama.cpp's quantized V cache)"):
        EngineSetting("q8_0", False)
    # f16 needs none; a quantized cache takes flash attention on or left to llama.cpp
    for kv, flash in (("f16", False), ("q8_0", True), ("q4_0", None)):
        assert EngineSetting(kv, flash).kv == kv
    for batch in (0, BATCH + 1):
        with refused_as(f"batch={batch}: 1 to {BATCH} tokens a step"):
            EngineSetting(batch=batch)
    assert EngineSetting(batch=1).batch == 1 and EngineSetting(batch=BATCH).label == "kv=f16"


class Here(ScriptedBackend):
    """A side teacher forcing would read as the model here (a model file and a local
    config), that answers from a script."""

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, "One two.")
        self.model_path = path
        self.config = LocalConfig(model_path=path)
        self.flash_attn: bool | None = None
        self.threads = 0
        self.gpu_layers = 0


TURNS = (
    (Message("user", "First?"),),
    (Message("user", "First?"), Message("assistant", "One two."), Message("user", "Next?")),
)


def run_diverge(a: object, b: object) -> list[Turn]:
    settings = Settings(max_tokens=8, temperature=0)
    sa, sb = Side("a", a, settings), Side("b", b, settings)  # type: ignore[arg-type]
    return asyncio.run(diverge(sa, sb, TURNS))


def test_an_unread_side_is_named_and_turns_count_from_one(tmp_path: Path) -> None:
    here = Here("here", tmp_path / "m.gguf")
    turns = run_diverge(here, ScriptedBackend("elsewhere"))
    assert [t.number for t in turns] == [1, 2]
    assert [t.why for t in turns] == ["B: elsewhere: its model file was not found"] * 2
    assert all(t.divergence is None for t in turns)
    turns = run_diverge(ScriptedBackend("elsewhere"), here)
    assert turns[0].why == "A: elsewhere: its model file was not found"
    assert [t.number for t in turns] == [1, 2]
    assert overall(turns) is None and overall_floor(turns) is None


def test_the_overall_floor_is_the_floors_not_the_settings_divergence(tmp_path: Path) -> None:
    [first, second] = run_diverge(ScriptedBackend("x"), ScriptedBackend("y"))
    turns = [
        dataclasses.replace(first, divergence=div([0.5, 0.7]), floor=div([0.01, 0.02])),
        dataclasses.replace(second, divergence=div([0.9]), floor=None),
    ]
    floor = overall_floor(turns)
    assert floor is not None and floor.kl == (0.01, 0.02)
    whole = overall(turns)
    assert whole is not None and whole.kl == (0.5, 0.7, 0.9)


@pytest.mark.model
def test_the_teacher_context_holds_the_sequence_rounded_up(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The context is the sequence rounded up to 256 cells: 257 tokens need 512 (256
    would not hold them), 100 need 256 (0 would be the model's whole training context)."""
    import llama_cpp

    sizes: list[int] = []
    real = llama_cpp.Llama.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        sizes.append(kwargs["n_ctx"])
        real(self, *args, **kwargs)

    monkeypatch.setattr(llama_cpp.Llama, "__init__", spy)
    for n in (100, 257):
        tokens = [1, *([28] * (n - 1))]
        logits = forced_logits(model_path, EngineSetting(threads=2), tokens, n - 2)
        assert logits.shape[0] == 2
    assert sizes == [256, 512]


def test_each_question_is_a_turn_with_the_history_the_chat_sends() -> None:
    chat = Conversation("Be brief.")
    for role, text, status in (
        ("user", "q1", "complete"),
        ("assistant", "a1", "complete"),
        ("user", "too long", "error"),  # refused: not sent again
        ("assistant", "", "error"),  # failed with no text: not sent again
        ("user", "q3", "complete"),
    ):
        chat.add(ChatMessage(role, text, status=status))  # type: ignore[arg-type]
    turns = chat_turns(chat)
    system = Message("system", "Be brief.")
    assert turns == [
        (system, Message("user", "q1")),
        (system, Message("user", "q1"), Message("assistant", "a1"), Message("user", "too long")),
        (system, Message("user", "q1"), Message("assistant", "a1"), Message("user", "q3")),
    ]
    assert chat_turns(Conversation("", [ChatMessage("user", "hi")])) == [(Message("user", "hi"),)]


def test_two_model_files_of_other_vocabularies_carry_the_reason_on_every_turn(
    tmp_path: Path,
) -> None:
    a = Here("a", tiny_gguf(tmp_path / "a.gguf", ["<s>", "a"]))
    b = Here("b", tiny_gguf(tmp_path / "b.gguf", ["<s>", "b"]))
    turns = run_diverge(a, b)
    assert [t.number for t in turns] == [1, 2]
    assert all(t.why is not None and "vocabularies differ" in t.why for t in turns)
    assert all(t.divergence is None and t.taught is None for t in turns)


def test_an_answer_without_token_ids_is_a_turn_that_says_so(tmp_path: Path) -> None:
    """Both sides read as the model here, one file: each turn asks A's answer for its
    token ids (a scripted answer has none) and says why there is no divergence."""
    path = tiny_gguf(tmp_path / "m.gguf", ["<s>", "a"])
    turns = run_diverge(Here("a", path), Here("b", path))
    why = "A's answer has no token ids"
    assert [(t.number, t.why, t.divergence) for t in turns] == [(1, why, None), (2, why, None)]
    assert [(t.a.side, t.b.side, t.a.round) for t in turns] == [(0, 1, 0), (0, 1, 1)]


class Failing(Here):
    """A side read as the model here whose answer fails."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        yield StreamError("model", "out of memory")


def test_a_turn_whose_a_did_not_answer_says_so(tmp_path: Path) -> None:
    path = tiny_gguf(tmp_path / "m.gguf", ["<s>", "a"])
    turns = run_diverge(Failing("a", path), Here("b", path))
    why = "A gave no complete answer"
    assert [(t.number, t.why, t.divergence) for t in turns] == [(1, why, None), (2, why, None)]
    assert [(t.a.side, t.b.side, t.b.text) for t in turns] == [(0, 1, "One two. ")] * 2


def test_a_local_side_is_read_with_its_own_setting(tmp_path: Path) -> None:
    here = Here("here", tmp_path / "m.gguf")
    here.flash_attn, here.threads, here.gpu_layers = True, 3, 2
    reader = reader_of(here)
    assert reader is not None and reader.whole and reader.name == "llama.cpp here"
    assert reader.forced == Forced(tmp_path / "m.gguf", EngineSetting("f16", True, 3, gpu_layers=2))
    here.threads = 0
    forced = forced_of(here)
    assert forced is not None and forced.setting.threads is None  # 0: llama.cpp's choice
    bare = Here("bare", tmp_path / "m.gguf")
    assert forced_of(bare) == Forced(tmp_path / "m.gguf", EngineSetting())
    bare.model_path = "m.gguf"  # type: ignore[assignment]  # not a Path: not a local side
    assert forced_of(bare) is None and reader_of(bare) is None


def test_caveats_are_said_once_each_in_order() -> None:
    client = httpx.AsyncClient()
    first = dataclasses.replace(forcing_of({}), cannot="first")
    second = dataclasses.replace(forcing_of({}), cannot="second")
    server = Server(client, "http://x/v1", {}, "m")
    readers = [
        Reader("s", forcing=second, server=server),
        None,
        Reader("here", forced=Forced(Path("m.gguf"), EngineSetting())),
        Reader("f", forcing=first, server=server),
        Reader("s2", forcing=second, server=server),
    ]
    assert caveats(readers) == ["second", "first"]
    assert caveats([]) == []


def test_a_servers_sequence_is_its_template_then_its_tokens_of_the_answer() -> None:
    forcing = forcing_of({})
    reader = Reader("A", forcing=forcing, server=Server(httpx.AsyncClient(), "http://x", {}, "a"))
    t = asyncio.run(teaching(reader, ScriptedBackend(), (Message("user", "q"),), "hé", None))
    assert t == Teaching((1,), (104, 195, 169), (b"h", b"\xc3", b"\xa9"), retokenized=True)
    assert t.text == "hé"
    with pytest.raises(ValueError, match="A's answer is empty"):
        asyncio.run(teaching(reader, ScriptedBackend(), (Message("user", "q"),), "", None))


def test_the_model_here_reads_its_own_prompt_ids_and_answer_ids(tmp_path: Path) -> None:
    here = Here("here", tmp_path / "m.gguf")
    reader = reader_of(here)
    assert reader is not None
    said = AnswerTokens((7, 8), (b"a", b"b"), "m.gguf")
    messages = (Message("user", "q"),)
    with pytest.raises(ValueError, match="did not read the prompt"):
        asyncio.run(teaching(reader, here, messages, "ab", said))
    with pytest.raises(ValueError, match="no token ids"):
        asyncio.run(teaching(reader, here, messages, "ab", AnswerTokens((), (), "m.gguf")))

    async def prompt_ids(messages: tuple[Message, ...]) -> list[int]:
        return [5, 6]

    here.prompt_ids = prompt_ids  # type: ignore[attr-defined]
    t = asyncio.run(teaching(reader, here, messages, "ab", said))
    assert t == Teaching((5, 6), (7, 8), (b"a", b"b")) and not t.retokenized
    assert floor(Reader("server", forcing=forcing_of({})), t) is None  # only the model here


def test_a_server_refusal_is_the_reason_and_each_side_reports_its_reading() -> None:
    async def refuse(server: Server, *_: Any) -> list[Listed]:
        raise TeacherError("B: HTTP 500: 'out of memory'")

    good = forcing_of({"a": [listed(A_P)]})
    bad = dataclasses.replace(good, top=refuse)
    client = httpx.AsyncClient()
    a = Reader("A", forcing=good, server=Server(client, "http://one:1/v1", {}, "a"))
    b = Reader("B", forcing=bad, server=Server(client, "http://two:2/v1", {}, "b"))
    t = Teaching((1,), (104,), (b"h",), retokenized=True)
    assert asyncio.run(measure(a, b, t)) == (None, "B: HTTP 500: 'out of memory'")
    seen: list[tuple[str, int, int]] = []

    async def top(
        server: Server, tokens: Any, start: int, progress: Any, stop: Any
    ) -> list[Listed]:
        assert (list(tokens), start) == ([1, 104], 1)  # the prompt, then the answer
        progress(1, 1)
        return [listed(A_P if server.model == "a" else B_P)]

    both = dataclasses.replace(good, top=top)
    a, b = (dataclasses.replace(r, forcing=both) for r in (a, b))
    d, why = asyncio.run(measure(a, b, t, lambda *p: seen.append(p)))
    assert why is None and d is not None and d.kl[0] == pytest.approx(KL_AB)
    assert seen == [("A", 1, 1), ("B", 1, 1)]


class Slow(ScriptedBackend):
    """Its words a few milliseconds apart: a side sent beside it would start before it
    ends."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        async for event in super().stream(request, every_s=every_s):
            await asyncio.sleep(0.005)
            yield event


def test_each_turn_is_a_round_of_a_then_b_handed_over_as_it_ends(tmp_path: Path) -> None:
    settings = Settings(max_tokens=8, temperature=0)
    a = Side("a", Slow("a", "From A."), settings)
    b = Side("b", Here("b", tmp_path / "m.gguf"), settings)
    seen: list[Turn] = []
    turns = asyncio.run(diverge(a, b, TURNS, on_turn=seen.append))
    assert seen == turns and len(turns) == 2
    for n, turn in enumerate(turns):
        assert (turn.a.side, turn.a.round, turn.b.side, turn.b.round) == (0, n, 1, n)
        assert (turn.a.text, turn.b.text) == ("From A. ", "One two. ")
        assert turn.a.request.messages[-1] == TURNS[n][-1]
        # A then B, not together: B is sent once A's answer is over
        assert turn.a.trace.t_done is not None and turn.a.trace.t_done <= turn.b.trace.t_sent
