"""`phasechat compare`: the bundled model through the local backend against a real
llama-server on the same GGUF, and a derived profile of the local model."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from phasechat.chat.trips.compare import METRICS, word_diff
from tests.test_cli import phasechat

KEYS = [key for key, _, _ in METRICS]


@pytest.mark.model
@pytest.mark.server
def test_local_against_llama_server_json(real_llama_server: str) -> None:
    r = phasechat(
        "compare",
        "Name three colours.",
        "--backend",
        "local",
        "--backend",
        "openai",
        "--base-url",
        real_llama_server,
        "--repeat",
        "2",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        "--json",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.strip().splitlines()
    out = json.loads(line)
    assert out["repeat"] == 2 and out["order"] == "interleaved" and out["cache"] == "cold"
    assert out["spread"] == "min-max"
    a, b = out["sides"]
    assert a["name"] == "local" and a["model"].endswith(".gguf")
    assert b["name"] == "openai"
    for side in (a, b):
        assert len(side["runs"]) == 2
        for run in side["runs"]:
            assert run["error"] is None and run["text"]
            assert 1 <= run["output_tokens"] <= 12
            assert 0 < run["ttft_ms"] <= run["e2e_ms"]
            # both engines report their cache: a cold run reuses at most the template's
            # first tokens before the round's own first line
            assert run["cache_reuse"] is not None and run["cache_reuse"] < 0.5
        for key in KEYS:
            stats, values = side["stats"][key], [x[key] for x in side["runs"]]
            known = [v for v in values if v is not None]
            assert stats["n"] == len(known)
            if known:
                assert stats["median"] == pytest.approx(statistics.median(known))
                assert stats["lo"] == min(known) and stats["hi"] == max(known)
    for key in KEYS:
        ma, mb = a["stats"][key]["median"], b["stats"][key]["median"]
        if ma and mb is not None:
            assert out["ratio"][key] == pytest.approx(mb / ma)
        else:
            assert out["ratio"][key] is None
    # the same prompt on the same GGUF: both engines read the same number of tokens
    assert a["runs"][0]["prompt_tokens"] == b["runs"][0]["prompt_tokens"]
    assert len(out["loadavg_before"]) == 3


@pytest.mark.model
def test_derived_profile_text_table() -> None:
    r = phasechat(
        "compare",
        "Hi",
        "--backend",
        "local:temperature=0",
        "--backend",
        "local:temperature=0,max_tokens=4",
        "--repeat",
        "1",
        "--max-tokens",
        "8",
        "--n-ctx",
        "1024",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == "A = local(temperature=0) · SmolLM2-135M-Instruct.Q4_1.gguf"
    assert lines[2].startswith("B = local(temperature=0,max_tokens=4) · ")
    assert "interleaved" in lines[0]  # one model instance: A then B, never together
    table = {line.split("  ")[0]: line for line in lines if line.startswith(("TTFT", "e2e"))}
    assert set(table) == {"TTFT (ms)", "e2e (ms)"}
    assert "load average" in lines[-1]


def test_the_floor_goes_with_a_chat() -> None:
    r = phasechat("compare", "Hi", "--backend", "local", "--backend", "local", "--floor")
    assert r.returncode == 2 and "--floor goes with --chat ID" in r.stderr


def test_compare_needs_two_backends() -> None:
    r = phasechat("compare", "Hi", "--backend", "local")
    assert r.returncode == 2 and "--backend twice" in r.stderr
    r = phasechat("compare", "Hi", "--backend", "local", "--backend", "local:threads")
    assert r.returncode == 2 and "key=value" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.model
def test_warm_rounds_find_the_prompt_cached_and_cold_ones_do_not() -> None:
    def reuse(*extra: str) -> list[float]:
        r = phasechat(
            "compare",
            "Name three colours.",
            "--backend",
            "local:temperature=0",
            "--backend",
            "local:temperature=0,seed=1",
            "--repeat",
            "2",
            "--max-tokens",
            "4",
            "--n-ctx",
            "1024",
            "--json",
            *extra,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["cache"] == ("warm" if extra else "cold")
        return [run["cache_reuse"] for side in out["sides"] for run in side["runs"]]

    # one model instance, one cache: warm, every run finds its prompt there; cold, B does
    # not find A's prompt either (each side has its own first line)
    assert all(x > 0.9 for x in reuse("--warm"))
    assert all(x < 0.5 for x in reuse())


@pytest.mark.model
def test_two_system_prompts_on_one_model(tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    long = tmp_path / "long.txt"
    short.write_text("Answer briefly, in plain words.\n")
    long.write_text(" ".join(["Answer briefly, in plain words."] * 10) + "\n")
    r = phasechat(
        "compare",
        "What is a lighthouse?",
        "--backend",
        f"local:system=@{short}",
        "--backend",
        f"local:system=@{long}",
        *("--repeat", "2", "--max-tokens", "8", "--n-ctx", "1024"),
        *("--temperature", "0", "--seed", "1", "--json"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    a, b = out["sides"]
    assert a["system"] == "Answer briefly, in plain words."
    assert b["system"] == " ".join(["Answer briefly, in plain words."] * 10)
    # every run cold: the longer system prompt is read whole each time
    prompt_a = {run["prompt_tokens"] for run in a["runs"]}
    prompt_b = {run["prompt_tokens"] for run in b["runs"]}
    assert min(prompt_b) > max(prompt_a) + 50
    assert b["stats"]["ttft_ms"]["median"] > a["stats"]["ttft_ms"]["median"]
    for side in (a, b):
        assert side["stats"]["output_tokens"]["median"] == statistics.median(
            run["output_tokens"] for run in side["runs"]
        )
    assert isinstance(out["answer_diff"], str)  # temperature 0 and a seed: a word diff


def test_a_prompt_variant_names_a_missing_file_in_one_line(tmp_path: Path) -> None:
    r = phasechat(
        "compare", "Hi", "--backend", "local", "--backend", f"local:system=@{tmp_path}/none.txt"
    )
    assert r.returncode == 2 and "none.txt" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1


def test_word_diff_marks_what_b_changed() -> None:
    assert word_diff("a tall white tower", "a short white tower") == (
        "a [-tall-] {+short+} white tower"
    )
    assert word_diff("same words", "same words") == "same words"
    assert word_diff("", "new") == "{+new+}"


def saved_chat() -> int:
    """A chat of three questions in the test's own data directory (the answers as a
    chat could have saved them), its id."""
    import asyncio

    from phasechat.chat.config.settings import Settings
    from phasechat.chat.store.database import ChatStore
    from phasechat.chat.store.writer import follow
    from phasechat.chat.turns import TurnController
    from tests.helpers import ask
    from tests.scripted import ScriptedBackend

    exchanges = (
        ("What is a lighthouse?", "A tower with a bright light that guides ships at night."),
        ("Where are they built?", "On coasts, headlands and reefs, where ships run aground."),
        ("Who kept them?", "Keepers, who lived there and tended the lamp every night."),
    )

    async def talk(turns: TurnController) -> None:
        for question, answer in exchanges:
            turns.backend.text = answer  # type: ignore[attr-defined]
            await ask(turns, question)

    with ChatStore() as store:
        chat = store.create_chat()
        turns = TurnController(ScriptedBackend(), Settings(system="Be brief."))
        follow(turns, store, chat)
        asyncio.run(talk(turns))
    return chat


def compare_chat(chat: int, b: str, a: str = "local", *extra: str) -> dict[str, Any]:
    """`compare --chat` of saved chat `chat`, A then B, greedy, 12 tokens an answer:
    its --json."""
    r = phasechat(
        "compare",
        "--chat",
        str(chat),
        "--backend",
        a,
        "--backend",
        b,
        *extra,
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--n-ctx",
        "1024",
        "--threads",
        "2",
        "--json",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


@pytest.mark.model
def test_a_saved_chat_on_two_kv_settings_every_turn() -> None:
    """Issue 39: the same setting twice diverges by exactly nothing over every turn; a
    q4_0 KV cache moves the distributions (KL above 0) and holds a token in 18 bytes of
    f16's 64."""
    chat = saved_chat()
    same = compare_chat(chat, "local:kv=f16", "local", "--floor")
    turns = same["turns"]
    assert isinstance(turns, list) and [t["turn"] for t in turns] == [1, 2, 3]
    for t in turns:
        d = t["divergence"]
        # every token of A's answer compared, the first predicted from the prompt
        assert d["positions"] == t["a"]["output_tokens"] > 0
        assert (d["kl_max"], d["top1_agreement"], d["first_divergence"]) == (0.0, 1.0, None)
        assert t["a"]["text"] == t["b"]["text"]  # greedy, same numbers: the same answer
    overall = same["divergence"]
    assert isinstance(overall, dict) and overall["kl_mean"] == 0.0
    assert overall["positions"] == sum(t["a"]["output_tokens"] for t in turns)
    # the engine's floor: A read a token a step against A's own read, the same positions;
    # the order of the sums moves the distributions a little (measured here: KL mean
    # 0.004), never the way a position off by one would
    for t in turns:
        f = t["floor"]
        assert f["positions"] == t["divergence"]["positions"]
        assert f["kl_max"] < 0.1 and f["top1_agreement"] >= 0.9
    assert same["floor"]["positions"] == overall["positions"]

    q4 = compare_chat(chat, "local:kv=q4_0")
    overall = q4["divergence"]
    assert isinstance(overall, dict) and overall["kl_mean"] > 0 and overall["kl_max"] > 0
    last = q4["turns"][-1]
    per_token = [last[s]["kv_bytes"] / last[s]["kv_tokens"] for s in ("a", "b")]
    assert per_token == [23040, 6480]  # 30 layers x 3 KV heads x 128 values; x 18/64
