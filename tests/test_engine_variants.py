"""Issue 39, item 1: engine settings as compare variants beyond the KV type: another GGUF
file (`model=PATH`, its vocabulary checked before teacher forcing) and speculative
decoding (`draft=PATH`, `draft=lookup`), whose greedy answer is the plain one."""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from phasechat.backends.events import (
    AnswerTokens,
    GenerationRequest,
    KVStats,
    Message,
    Notice,
    ServerTimings,
)
from phasechat.backends.local.backend import DRAFT_GREEDY_ONLY, LocalBackend, LocalConfig
from phasechat.backends.local.gguf import VOCAB_KEY, vocabulary
from phasechat.backends.local.models import gemma3_model_path
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare_targets import derive
from phasechat.chat.trips.forced_sides import vocabulary_differs
from tests.test_compare_cli import compare_chat, saved_chat


def tiny_gguf(path: Path, tokens: list[str]) -> Path:
    """A GGUF file whose only metadata is its vocabulary."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array(VOCAB_KEY, tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_model_file_is_checked_before_it_is_loaded(tmp_path: Path, model_path: Path) -> None:
    spec, settings = BackendSpec("local"), Settings()
    with pytest.raises(ValueError, match=r"model=.*model file not found"):
        derive("local", spec, settings, {"model": str(tmp_path / "gone.gguf")})
    text = tmp_path / "notes.gguf"
    text.write_text("GGML is not GGUF")
    with pytest.raises(ValueError, match=r"not a GGUF model file \(starts with b'GGML'"):
        derive("local", spec, settings, {"model": str(text)})
    with pytest.raises(ValueError, match=r"draft=.*not a GGUF"):
        derive("local", spec, settings, {"draft": str(text)})
    with pytest.raises(ValueError, match="model applies to a local model"):
        derive("server", BackendSpec("openai"), settings, {"model": str(model_path)})
    target = derive("local", spec, settings, {"model": str(model_path)})
    assert target.own_backend and target.spec.local.model_path == model_path
    assert target.name == f"local(model={model_path.name})"  # the file's name, not its path
    lookup = derive("local", spec, settings, {"draft": "lookup"})
    assert lookup.spec.local.draft == "lookup" and lookup.name == "local(draft=lookup)"
    drafted = derive("local", spec, settings, {"draft": str(model_path)})
    assert drafted.spec.local.draft == str(model_path)


def test_vocabularies_are_told_apart_by_every_token_in_order(tmp_path: Path) -> None:
    a = tiny_gguf(tmp_path / "a.gguf", ["<s>", "a", "bc"])
    same = tiny_gguf(tmp_path / "same.gguf", ["<s>", "a", "bc"])
    # the same characters in the same order, split into other tokens: a digest of the
    # joined strings would call them equal
    moved = tiny_gguf(tmp_path / "moved.gguf", ["<s>", "ab", "c"])
    digest = hashlib.sha256()
    for t in ("<s>", "a", "bc"):
        digest.update(struct.pack("<Q", len(t)) + t.encode())
    assert vocabulary(a) == f"<3 tokens, sha256 {digest.hexdigest()[:16]}>"
    assert vocabulary_differs(a, same) is None
    why = vocabulary_differs(a, moved)
    assert why is not None and "vocabularies differ" in why and "moved.gguf" in why


@pytest.mark.model
def test_smollm2_and_gemma3_have_other_vocabularies(model_path: Path) -> None:
    why = vocabulary_differs(model_path, gemma3_model_path())
    assert why is not None and "49152 tokens" in why and "262144 tokens" in why


@dataclass
class Greedy:
    """What one answer left: its token ids, timings, notices, and the tokens the KV
    cache held after it."""

    ids: tuple[int, ...] = ()
    timings: ServerTimings | None = None
    notices: list[str] = field(default_factory=list)
    held: int | None = None
    #: the stream's wall time, from the request to its last event
    wall_ms: float = 0.0


async def greedy(draft: str | None, model_path: Path, temperature: float = 0.0) -> Greedy:
    """One answer on a fresh load (greedy unless told)."""
    backend = LocalBackend(
        LocalConfig(model_path=model_path, n_ctx=1024, threads=2, draft=draft, warmup=False)
    )
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    request = GenerationRequest(
        (Message("user", "List the first ten prime numbers, then say why 9 is not one."),),
        max_tokens=60,
        temperature=temperature,
    )
    out = Greedy()
    sent = time.perf_counter()
    try:
        async for event in backend.stream(request):
            if isinstance(event, AnswerTokens):
                out.ids = event.ids
            elif isinstance(event, ServerTimings):
                out.timings = event
            elif isinstance(event, Notice):
                out.notices.append(event.text)
            elif isinstance(event, KVStats):
                out.held = event.used_tokens
        out.wall_ms = (time.perf_counter() - sent) * 1000
    finally:
        await backend.aclose()
    assert out.timings is not None
    return out


@pytest.mark.model
def test_a_draft_changes_the_speed_never_the_greedy_answer(model_path: Path) -> None:
    """Speculative decoding keeps only the tokens the model would have chosen itself:
    with the model as its own draft, and with prompt lookup, the answer is the plain
    greedy one, token for token; the draft's counts come with the timings, and the
    cache holds what the plain answer leaves in it (not the proposals past its end)."""
    plain = asyncio.run(greedy(None, model_path))
    assert plain.timings is not None
    assert len(plain.ids) == 60 and plain.timings.draft_n is None
    for draft in (str(model_path), "lookup"):
        out = asyncio.run(greedy(draft, model_path))
        assert out.ids == plain.ids and not out.notices, draft
        assert out.held == plain.held, draft
        t = out.timings
        assert t is not None and t.draft_n is not None and t.draft_n_accepted is not None
        assert 0 < t.draft_n_accepted <= t.draft_n, draft
        # the decode is the answer's tokens, not the batches that read the proposals
        assert t.predicted_n == len(plain.ids) and t.prompt_n == plain.timings.prompt_n
        # the decode by the clock, the draft's work in it: inside the stream's own time
        assert t.predicted_ms is not None and 0 < t.predicted_ms < out.wall_ms
        if draft != "lookup":
            # the model drafting for itself agrees with itself nearly always (4 proposals
            # a step: 60 tokens take about 12 steps, so about 48 proposals)
            assert t.draft_n_accepted >= 0.8 * t.draft_n and t.draft_n <= 4 * len(plain.ids)


@pytest.mark.model
def test_a_sampled_answer_decodes_without_its_draft_and_says_so(model_path: Path) -> None:
    out = asyncio.run(greedy("lookup", model_path, temperature=0.8))
    assert out.timings is not None
    assert out.ids and out.timings.draft_n is None and out.notices == [DRAFT_GREEDY_ONLY]


@pytest.mark.model
def test_a_draft_of_another_vocabulary_is_refused_at_load(model_path: Path) -> None:
    backend = LocalBackend(
        LocalConfig(model_path=model_path, n_ctx=512, draft=str(gemma3_model_path()))
    )
    asyncio.run(backend.start())
    assert backend.state == "failed"
    assert "vocabulary" in backend.state_detail and "262144 tokens" in backend.state_detail


@pytest.mark.model
def test_a_saved_chat_with_a_draft_and_with_another_vocabulary(model_path: Path) -> None:
    """`compare --chat` against a draft side: KL exactly 0 (the model's distributions
    are the draft's to check, not to change), the first answer the same, the draft's
    counts per turn; against gemma3: no divergence and why, the speed kept."""
    chat = saved_chat()
    drafted = compare_chat(chat, f"local:draft={model_path}")
    assert drafted["kv_bytes_per_token"] == [23040, 23040]
    turns = drafted["turns"]
    assert isinstance(turns, list)
    # the first answer from the same prompt: token for token the plain one (over a long
    # chat the verification batches' other order of sums can flip a near tie: measured
    # in bench.kv_settings, 4 of 10 answers the same; `same_answer` says which)
    assert turns[0]["same_answer"] is True and turns[0]["a"]["text"] == turns[0]["b"]["text"]
    for t in turns:
        assert t["same_answer"] == (t["a"]["text"] == t["b"]["text"])
        assert t["divergence"]["kl_max"] == 0.0 and t["divergence"]["top1_agreement"] == 1.0
        assert t["a"]["draft_n"] is None and t["b"]["draft_n"] > 0
        assert 0 <= t["b"]["draft_accepted"] <= t["b"]["draft_n"]

    other = compare_chat(chat, f"local:model={gemma3_model_path()}")
    assert other["divergence"] is None
    # gemma3-270m: 18 layers, 1 KV head of 256 values for K and V each, at f16
    assert other["kv_bytes_per_token"] == [23040, 18 * 1 * (256 + 256) * 2]
    for t in other["turns"]:
        assert t["divergence"] is None and "vocabularies differ" in t["why"]
        assert t["b"]["decode_tok_s"] is not None and t["b"]["decode_tok_s"] > 0
