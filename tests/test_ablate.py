"""Ablation (chat/trips/ablate.py): the sections a prompt can lose, the answers compared,
and, on the bundled model, one row per section whose tokens add up to the prompt, a long
system prompt's removal saving cold TTFT, and `phasechat ablate --json` on a saved chat."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.widgets import Static

from phasechat.backends.events import Event, GenerationRequest, Message
from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.chat.engine_held import parts_of
from phasechat.chat.trim.summarize import SUMMARY_HEADER
from phasechat.chat.trips.ablate import (
    CACHE_AFTER,
    Ablation,
    cuts_of,
    report_lines,
    words_in_common,
)
from phasechat.telemetry.anatomy import split_estimated
from phasechat.telemetry.metrics import Metrics, metrics_from_dict
from phasechat.tui.app import PhasechatApp
from phasechat.tui.screens.ablate_screen import AblateScreen
from phasechat.tui.screens.confirm import ConfirmScreen
from tests.helpers import COLD_MAX, settled, wait_for
from tests.scripted import ScriptedBackend

LONG_SYSTEM = "You are a careful tutor. " + " ".join(
    f"Rule {i}: answer plainly, in short sentences, with no lists and no headings."
    for i in range(12)
)


def chat(system: str) -> tuple[Message, ...]:
    """A 4-turn chat's last request: three exchanges, then the fourth question."""
    out = [Message("system", system)]
    for q, a in (("What is a lighthouse?", "A tower with a light."),
                 ("Who keeps it?", "A keeper, once."),
                 ("Is it used today?", "Yes, automated.")):  # fmt: skip
        out += [Message("user", q), Message("assistant", a)]
    return (*out, Message("user", "Name one famous lighthouse."))


def test_each_section_is_cut_with_the_roles_still_alternating() -> None:
    messages = chat("Be brief.")
    cuts = cuts_of(messages)
    assert [c.name for c in cuts] == ["system prompt", "exchange 1", "exchange 2", "exchange 3"]
    for cut in cuts:
        roles = [m.role for m in cut.messages if m.role != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        assert cut.messages[-1] == messages[-1]  # the question stays
    assert cuts[0].messages == messages[1:]
    assert cuts[2].messages == (*messages[:3], *messages[5:])  # exchange 2 is messages 3-4
    assert cuts[2].message_indices == (3, 4)


def test_a_summary_and_the_system_prompt_are_cut_apart() -> None:
    system = Message("system", f"Be brief.\n\n{SUMMARY_HEADER}They spoke of towers.")
    messages = (system, Message("user", "And now?"))
    cuts = {c.name: c for c in cuts_of(messages)}
    assert set(cuts) == {"system prompt", "summary"}
    assert cuts["summary"].messages[0] == Message("system", "Be brief.")
    assert cuts["system prompt"].messages[0].content == f"{SUMMARY_HEADER}They spoke of towers."


def test_words_in_common_counts_repeats_once_each() -> None:
    assert words_in_common("a b c d", "a b c d") == 1.0
    assert words_in_common("a a b", "a b b") == pytest.approx(2 / 3)
    assert words_in_common("one two", "three four five six") == 0.0


def test_words_in_common_are_a_share_of_the_longer_answer() -> None:
    # 2 words in common; the longer answer has 4: a half (of the shorter's 2: all)
    assert words_in_common("a b", "a b c d") == 0.5
    assert words_in_common("a b c d", "a b") == 0.5
    # 3 in common ("x" twice, "y" once) of the longer's 6
    assert words_in_common("x x y", "x y x z z z") == 0.5
    assert words_in_common("", "") == 1.0  # two empty answers are the same
    assert words_in_common("", "a") == 0.0


@pytest.mark.model
def test_ablation_on_the_bundled_model(local_backend: LocalBackend) -> None:
    messages = chat(LONG_SYSTEM)
    ablation = Ablation(local_backend, Settings(max_tokens=8, temperature=0, seed=1), messages)
    asyncio.run(ablation.run(repeat=2))
    rows = {r.section: r for r in ablation.rows()}
    assert set(rows) == {"system prompt", "exchange 1", "exchange 2", "exchange 3"}
    # the rows and what stays in every variant are the prompt, by the engine's own count
    total = local_backend.count_tokens(messages).tokens
    assert ablation.prompt_tokens == total
    assert sum(r.tokens or 0 for r in rows.values()) + (ablation.kept_tokens() or 0) == total
    system = rows["system prompt"]
    assert system.tokens is not None and system.tokens > 150  # the long one
    # cold runs: without ~200 of ~320 tokens, the prefill (and so TTFT) is shorter
    ttft, prefill = system.deltas["ttft_ms"], system.deltas["prefill_ms"]
    assert ttft is not None and ttft < 0 and prefill is not None and prefill < 0
    # every run was cold: none found more cached than the template's first tokens and its
    # own first line (`<|im_start|>system\n[` is 4 tokens on this model; two random
    # first lines may share a leading hex digit or two, never the prompt behind them)
    for variant in ablation.variants:
        assert len(variant.runs) == 2
        assert all((m.cached_tokens or 0) <= COLD_MAX for m, _ in variant.runs)
    assert ablation.rows()[0].deltas["e2e_ms"] == min(
        r.deltas["e2e_ms"] or 0.0 for r in rows.values()
    )


@pytest.mark.model
def test_ablate_a_saved_chat_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    fast = ("--max-tokens", "4", "--n-ctx", "512", "--temperature", "0")

    def phasechat(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "phasechat", *args], capture_output=True, text=True, timeout=300
        )

    first = phasechat("ask", "--json", *fast, "--system", "Be brief.", "What is a lighthouse?")
    chat_id = str(json.loads(first.stdout)["chat_id"])
    assert phasechat("ask", "--json", *fast, "--chat", chat_id, "Who keeps it?").returncode == 0
    r = phasechat("ablate", *fast, "--chat", chat_id, "--repeat", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # with --json too, the count first and each run as it ends, on stderr (not a terminal
    # here: a line a run): the full prompt, without the system prompt, without exchange 1
    lines = r.stderr.splitlines()
    assert lines[0].startswith("ablate: 3 cold runs (3 prompts x --repeat 1), about ")
    assert [line.split(", about")[0] for line in lines[1:4]] == [
        "run 1/3 (the full prompt)",
        "run 2/3 (system prompt)",
        "run 3/3 (exchange 1)",
    ]
    assert [s["section"] for s in doc["sections"]].count("exchange 1") == 1
    assert {s["section"] for s in doc["sections"]} == {"system prompt", "exchange 1"}
    assert doc["sections_source"] == "tokenizer"
    assert sum(s["tokens"] for s in doc["sections"]) + doc["kept_tokens"] == doc["prompt_tokens"]
    for s in doc["sections"]:
        assert set(s) >= {"ttft_ms_delta", "prefill_ms_delta", "output_tokens_delta",
                          "decode_ms_delta", "e2e_ms_delta", "answer_identical"}  # fmt: skip
    # nothing was added to the chat
    exported = phasechat("chats", "export", chat_id, "--format", "json")
    assert len(json.loads(exported.stdout)["messages"]) == 5  # system, 2 questions, 2 answers

    bad = phasechat("ablate", *fast, "--chat", "999")
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "999" in bad.stderr


@pytest.mark.model
async def test_the_palettes_ablation_runs_on_the_chat_shown_and_adds_nothing(
    local_backend: LocalBackend,
) -> None:
    settings = Settings(system="Be brief.", max_tokens=4, temperature=0)
    app = PhasechatApp(settings=settings, backend=local_backend)
    async with app.run_test(size=(160, 40)) as pilot:
        for i, q in enumerate(("Name a colour.", "Name a fruit."), 1):
            app.chat.send(q)
            await settled(pilot, app, i)
        before = [m.id for m in app.turns.conversation.every()]
        app.chat.action_ablate()
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, AblateScreen)
        table = screen.query_one("#text", Static)
        await wait_for(pilot, lambda: "kept in every variant" in str(table.render()))
        text = str(table.render())
        assert "system prompt" in text and "exchange 1" in text and CACHE_AFTER in text
        assert screen.runs == 3 * 3  # the full prompt and two cuts, 3 runs each
        await pilot.press("escape")
        assert [m.id for m in app.turns.conversation.every()] == before


class Counted(ScriptedBackend):
    """Counts the requests it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests += 1
        async for event in super().stream(request, every_s=every_s):
            yield event


async def test_the_palette_asks_before_a_long_ablation_and_no_starts_nothing() -> None:
    backend = Counted()
    app = PhasechatApp(settings=Settings(system="Be brief."), backend=backend)
    async with app.run_test(size=(160, 40)) as pilot:
        for i in range(1, 11):  # 10 exchanges, then the last question's answer: 11 in all
            app.chat.send(f"question {i}")
            await settled(pilot, app, i)
        app.chat.send("the last question")
        await settled(pilot, app, 11)
        requests = backend.requests
        # the full prompt, the system prompt and 10 earlier exchanges: 12 x 3 = 36 runs
        app.chat.action_ablate()
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and bool(app.screen.query(Static))
        )
        question = app.screen.query(Static).first()
        assert "Start 36 cold runs?" in str(question.render())
        detail = str(app.screen.query(Static).last().render())
        assert detail.startswith("ablate: 36 cold runs (12 prompts x --repeat 3)")
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert not isinstance(app.screen, AblateScreen) and backend.requests == requests
        app.chat.action_ablate()
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, AblateScreen))
        await wait_for(pilot, lambda: backend.requests > requests)  # the runs started
        await pilot.press("escape")


def _run(ttft: float, e2e: float, out: int, prompt_ms: float | None = None) -> Metrics:
    return metrics_from_dict(
        {"backend": "b", "model": "m", "finish": "stop", "ttft_ms": ttft, "e2e_ms": e2e,
         "output_tokens": out, "server_prompt_ms": prompt_ms}
    )  # fmt: skip


def test_rows_are_each_cuts_medians_less_the_full_prompts_sorted_by_what_they_saved() -> None:
    messages = chat("Be brief.")
    ablation = Ablation(ScriptedBackend(), Settings(temperature=0), messages)
    # sections by words: system 2, exchanges 4 + 5, 3 + 3, 4 + 2, the question 4; the
    # template the rest of 40 (13)
    words = lambda text: len(text.split())  # noqa: E731
    ablation.anatomy = split_estimated(parts_of(messages), 40, None, None, words)
    full, system, one, two, three = ablation.variants
    # the full prompt, three runs: medians TTFT 120, e2e 1,100, 60 tokens, decode 980
    # (the means would be 140, 1,233, 57, 1,093)
    full.runs = [(_run(100, 1000, 50), "a b c d"), (_run(200, 1600, 61), "z"),
                 (_run(120, 1100, 60), "y")]  # fmt: skip
    system.runs = [(_run(90, 950, 58), "a b c d")]
    one.runs = [(_run(80, 1200, 70, prompt_ms=40.0), "a b")]  # the engine's prompt time
    two.runs = [(_run(120, 1000, 60), "a b c d e")]
    three.runs = [(_run(130, 1050, 60), "x")]
    rows = ablation.rows()
    assert [r.section for r in rows] == ["system prompt", "exchange 2", "exchange 3", "exchange 1"]
    assert rows[0].as_dict() == {
        "section": "system prompt",
        "kind": "system",
        "message_indices": [0],
        "tokens": 2,
        "ttft_ms_delta": -30.0,
        "prefill_ms_delta": -30.0,
        "output_tokens_delta": -2.0,
        "decode_ms_delta": -120.0,  # 860 - 980
        "e2e_ms_delta": -150.0,
        "answer_identical": True,
        "words_in_common": 1.0,
    }
    by_name = {r.section: r for r in rows}
    one_row = by_name["exchange 1"]
    assert (one_row.tokens, one_row.message_indices) == (9, (1, 2))
    assert one_row.deltas == {
        "ttft_ms": -40.0,
        "prefill_ms": -80.0,  # its engine's 40 ms against the full prompt's TTFT (120)
        "output_tokens": 10.0,
        "decode_ms": 140.0,
        "e2e_ms": 100.0,
    }
    assert (one_row.answer_identical, one_row.words_in_common) == (False, 0.5)
    assert (by_name["exchange 2"].tokens, by_name["exchange 2"].words_in_common) == (6, 0.8)
    assert (by_name["exchange 3"].tokens, by_name["exchange 3"].words_in_common) == (6, 0.0)
    assert ablation.kept_tokens() == 17 and ablation.prompt_tokens == 40
    lines = report_lines(ablation)
    assert lines[1].split() == ["system", "prompt", "~2", "-30.0", "ms", "-30.0", "ms", "-2.0",
                                "-120.0", "ms", "-150.0", "ms", "same", "answer"]  # fmt: skip
    assert lines[-4].endswith("changed (50% words in common)")
    assert lines[-3] == "kept in every variant: the question and the template, ~17 tokens"
    assert lines[-2] == (
        "the full prompt: TTFT 120.0 ms, prefill 120.0 ms, output 60.0 tok, decode 980.0 ms, "
        "e2e 1,100.0 ms"
    )
