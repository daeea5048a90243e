"""Teacher-forced divergence (issue 39): known answers on hand-made distributions, and
the bundled model under two KV-cache settings."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from phasechat.backends.local.gguf import KV_TYPE_BYTES, KV_TYPE_NAMES, geometry
from phasechat.backends.local.teacher import EngineSetting, forced_logits
from phasechat.telemetry.divergence import combine, compare_logits, log_softmax
from tests.near import near

LN2, LN3 = math.log(2), math.log(3)
#: three positions over a vocabulary of three:
#: 0: the same uniform distribution on both sides (KL 0, both choose token 0);
#: 1: p = (.5, .25, .25) against q = (.25, .5, .25): KL = .5 ln 2 + .25 ln .5 = .25 ln 2,
#:    and the most likely tokens differ (0 against 1);
#: 2: p = (.2, .2, .6) against q = (.25, .25, .5): KL = .4 ln .8 + .6 ln 1.2, both choose 2.
REF = np.array([[0.0, 0.0, 0.0], [LN2, 0.0, 0.0], [0.0, 0.0, LN3]])
OTHER = np.array([[5.0, 5.0, 5.0], [0.0, LN2, 0.0], [0.0, 0.0, LN2]])
KL = (0.0, 0.25 * LN2, 0.4 * math.log(0.8) + 0.6 * math.log(1.2))


def test_known_distributions_give_the_kl_worked_out_by_hand() -> None:
    d = compare_logits(REF, OTHER)
    assert d.kl == pytest.approx(KL, abs=1e-12)
    assert d.kl[0] == 0.0  # a shift of every logit changes nothing
    assert d.positions == 3
    assert d.kl_mean == pytest.approx(sum(KL) / 3)
    # numpy's linear 99th percentile of (0, 0.0201, 0.1733): 0.0201 + 0.98 x (0.1733 - 0.0201)
    assert d.kl_p99 == pytest.approx(KL[2] + 0.98 * (KL[1] - KL[2]))
    assert (d.kl_max, d.kl_max_at) == (near(KL[1]), 1)
    assert d.top1_agreement == pytest.approx(2 / 3)
    assert d.first_divergence == 1
    assert d.agree == (True, False, True)
    # KL(reference || other), not the other way round: .25 ln .5 + .5 ln 2 at position 1
    # is the same here, so position 2 tells: KL(q || p) = .5 ln(.25/.2) + .5 ln(.5/.6)
    backwards = compare_logits(OTHER, REF)
    assert backwards.kl[2] == pytest.approx(0.5 * math.log(1.25) + 0.5 * math.log(5 / 6))
    assert backwards.kl[2] != pytest.approx(d.kl[2])


def test_identical_logits_give_zero_and_full_agreement() -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(50, 1000)).astype(np.float32)
    d = compare_logits(logits, logits.copy())
    assert (d.kl_mean, d.kl_max, d.kl_p99) == (0.0, 0.0, 0.0)
    assert (d.top1_agreement, d.first_divergence) == (1.0, None)


def test_a_swapped_top_choice_is_found_at_its_position() -> None:
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(40, 100))
    other = ref.copy()
    # at position 17 the two best tokens change places: nothing else moves
    row = other[17]
    first, second = np.argsort(row)[-1], np.argsort(row)[-2]
    row[first], row[second] = row[second], row[first]
    d = compare_logits(ref, other)
    assert d.first_divergence == 17 and d.kl_max_at == 17
    assert d.top1_agreement == pytest.approx(39 / 40)
    assert d.kl_max > 0 and sum(v > 0 for v in d.kl) == 1


def test_answers_combine_in_order_and_by_position() -> None:
    same = compare_logits(REF[:1], REF[:1])  # one position, agreeing
    both = combine([same, compare_logits(REF, OTHER)])
    assert both.positions == 4
    assert both.first_divergence == 2  # position 1 of the second answer
    assert both.kl_max_at == 2 and both.top1_agreement == pytest.approx(3 / 4)
    assert both.kl_mean == pytest.approx(sum(KL) / 4)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="not the same positions"):
        compare_logits(REF, OTHER[:2])
    with pytest.raises(ValueError, match="one of f16, q8_0, q4_0"):
        EngineSetting(kv="q5_1")
    with pytest.raises(ValueError, match="needs flash attention"):
        EngineSetting(kv="q4_0", flash_attn=False)
    for batch in (0, 513):
        with pytest.raises(ValueError, match="1 to 512 tokens a step"):
            EngineSetting(batch=batch)
    assert EngineSetting(batch=1).label == "kv=f16 batch=1" and EngineSetting().label == "kv=f16"


def test_log_softmax_survives_huge_logits() -> None:
    out = log_softmax(np.array([[1e308, 0.0]]))
    assert out[0, 0] == 0.0 and out[0, 1] == -1e308


@pytest.mark.model
def test_the_bundled_model_same_setting_is_zero_and_q4_0_is_not(model_path) -> None:  # type: ignore[no-untyped-def]
    from llama_cpp import Llama

    tok = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    prompt = tok.tokenize(b"The lighthouse keeper climbed the stairs every evening to")
    answer = tok.tokenize(
        b" light the lamp, wind the clockwork, and watch the ships pass the rocks.", add_bos=False
    )
    tokens, start = prompt + answer, len(prompt)
    f16 = forced_logits(
        model_path, EngineSetting(kv="f16", flash_attn=True, threads=2), tokens, start
    )
    again = forced_logits(
        model_path, EngineSetting(kv="f16", flash_attn=True, threads=2), tokens, start
    )
    q4 = forced_logits(model_path, EngineSetting(kv="q4_0", threads=2), tokens, start)
    assert f16.shape == (len(answer), tok.n_vocab())
    same = compare_logits(f16, again)
    assert (same.kl_max, same.top1_agreement, same.first_divergence) == (0.0, 1.0, None)
    moved = compare_logits(f16, q4)
    assert moved.kl_mean > 0 and moved.kl_max > 0
    # the KV memory the types imply, as llama.cpp holds it: a sequence's saved state
    # grows by the KV bytes of each token (30 layers x 3 KV heads x (64 + 64) values:
    # 23,040 bytes at f16, 18/64 of that at q4_0, 34/64 at q8_0), and 12 bytes of the
    # cell's own (its position, its count of sequences and the sequence id: 3 int32)
    g = geometry(model_path)
    for kv in ("f16", "q8_0", "q4_0"):
        per_token = g.kv_bytes(1, 2048, EngineSetting(kv=kv).bytes_per_value)
        assert state_bytes_per_token(model_path, KV_TYPE_NAMES[kv]) == per_token + 12
    assert g.kv_bytes(1, 2048, KV_TYPE_BYTES[KV_TYPE_NAMES["q4_0"]]) == 23040 * 18 // 64


def state_bytes_per_token(model_path: Path, ggml_type: int) -> int:
    """llama.cpp's own size of one sequence's state, per token: (size at 150 tokens -
    size at 50) / 100 (the fixed header cancels)."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(model_path),
        n_ctx=256,
        type_k=ggml_type,
        type_v=ggml_type,
        flash_attn=True,
        verbose=False,
    )
    try:
        sizes: list[int] = []
        for n in (50, 150):
            llm.reset()
            llm.eval([100 + i % 50 for i in range(n)])
            sizes.append(llama_cpp.llama_state_seq_get_size(llm.ctx, 0))
        return (sizes[1] - sizes[0]) // 100
    finally:
        llm.close()


def test_a_position_over_the_chat_is_named_by_its_turn_and_token() -> None:
    from phasechat.chat.trips.diverge import Turn
    from phasechat.cli.commands.diverge_cli import where

    three, one = compare_logits(REF, OTHER), compare_logits(REF[:1], REF[:1])
    turns = [
        Turn(1, None, None, three),  # type: ignore[arg-type]
        Turn(2, None, None, None, "A gave no complete answer"),  # type: ignore[arg-type]
        Turn(3, None, None, one),  # type: ignore[arg-type]
    ]
    assert [where(p, turns) for p in range(4)] == [
        "turn 1, token 1",
        "turn 1, token 2",
        "turn 1, token 3",
        "turn 3, token 1",  # turn 2 compared nothing: it has no positions
    ]
    with pytest.raises(ValueError, match="past the turns"):
        where(4, turns)


@pytest.mark.model
def test_teacher_forcing_reads_each_side_with_its_gpu_layers(model_path: Path) -> None:
    """A side that offloads layers is read teacher-forced with the same offload (on a
    CPU build llama.cpp ignores the number; on a GPU it sums in another order)."""
    import asyncio

    from phasechat.backends.local.backend import LocalBackend, LocalConfig
    from phasechat.chat.trips.forced_sides import forced_of

    sides = [
        LocalBackend(LocalConfig(model_path=model_path, n_ctx=512, gpu_layers=n)) for n in (3, None)
    ]
    for side in sides:
        asyncio.run(side.start())
        assert side.state == "ready", side.state_detail
    try:
        offloaded, default = (forced_of(side) for side in sides)
        assert offloaded is not None and default is not None
        assert offloaded.setting.gpu_layers == 3 and "gpu_layers=3" in offloaded.setting.label
        assert default.setting.gpu_layers == sides[1].gpu_layers  # 0 here: a CPU build
    finally:
        for side in sides:
            asyncio.run(side.aclose())
