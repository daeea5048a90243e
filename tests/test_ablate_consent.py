"""`ablate` on a long chat (issue 38, item 7): the count and an estimate first, a
question on a terminal, a refusal without one unless `--yes` or `--max-runs`, and the
runs reported on stderr as they end (the bundled model's run is in test_ablate.py)."""

from __future__ import annotations

import argparse
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from phasechat.backends.base import TokenCount
from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.store.database import ChatStore
from phasechat.chat.store.writer import follow
from phasechat.chat.trim.summarize import SUMMARY_HEADER
from phasechat.chat.trips.ablate import ASK_ABOVE_RUNS, Ablation, duration
from phasechat.chat.turns import InputError, TurnController
from phasechat.cli.commands.ablate_cli import _consent
from phasechat.telemetry.forecast import Rates
from phasechat.telemetry.metrics import metrics_from_dict

#: an answer's saved figures: 1,000 tok/s of prefill, 50 tok/s of decode, on "local"
SAVED = {
    "backend": "local",
    "ttft_ms": 100.0,
    "e2e_ms": 300.0,
    "prompt_tokens": 100,
    "evaluated_prompt_tokens": 100,
    "prefill_tok_s": 1000.0,
    "decode_tok_s": 50.0,
    "output_tokens": 10,
}


def long_chat(questions: int) -> int:
    """A saved chat of `questions` answered questions, written through the store."""
    messages: list[ChatMessage] = []
    for i in range(questions):
        answer = ChatMessage(
            "assistant", f"answer {i}", "local", "m", metrics=metrics_from_dict(SAVED)
        )
        messages += [ChatMessage("user", f"question {i}"), answer]
    turns = TurnController(LocalBackend())  # never started: nothing is generated
    turns.replace_conversation(Conversation("Be brief.", tuple(messages)))
    with ChatStore() as store:
        chat_id = store.create_chat(system="Be brief.")
        follow(turns, store, chat_id)
    return chat_id


def ablate(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phasechat", "ablate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=stdin,
    )


def test_200_turns_without_a_terminal_are_said_and_refused_before_any_run() -> None:
    chat_id = str(long_chat(200))
    r = ablate("--chat", chat_id)
    assert r.returncode == 2 and r.stdout == ""
    plan, refusal = r.stderr.splitlines()
    # 200 exchanges + the system prompt + the full prompt = 201 prompts, 3 runs each
    assert plan.startswith("ablate: 603 cold runs (201 prompts x --repeat 3), about ")
    assert plan.endswith("at this backend's speeds in this chat (answers of up to 512 tokens)")
    assert refusal == (
        "phasechat: 603 cold runs is a long job and there is no terminal to ask: "
        "pass --yes or --max-runs 603 to start them"
    )
    # with --json too: the plan on stderr, nothing on stdout, nothing run
    r = ablate("--chat", chat_id, "--json", "--max-runs", "100")
    assert r.returncode == 2 and r.stdout == "" and "run 1/" not in r.stderr
    assert r.stderr.splitlines()[1] == (
        "phasechat: 603 runs exceed --max-runs 100: nothing run "
        "(fewer: --repeat 1, or a chat with fewer turns)"
    )


def test_on_a_terminal_it_asks_and_a_no_runs_nothing() -> None:
    chat_id = str(long_chat(200))
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "phasechat", "ablate", "--chat", chat_id],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(follower)
    assert proc.stderr is not None
    asked = ""
    deadline = time.monotonic() + 120
    while "[y/N]" not in asked and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stderr], [], [], 0.5)[0]:
            asked += os.read(proc.stderr.fileno(), 4096).decode()
    assert asked.endswith("start 603 runs? [y/N] "), asked
    os.write(leader, b"n\n")
    out, err = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 2 and out == ""
    assert err == "phasechat: nothing run\n"


def consent(runs: int, *, yes: bool = False, max_runs: int | None = None) -> None:
    _consent(argparse.Namespace(yes=yes, max_runs=max_runs), runs, None)


def test_the_threshold_and_the_flags_that_consent() -> None:
    # stdin is not a terminal under pytest: past the threshold only a flag says yes
    assert not sys.stdin.isatty()
    consent(ASK_ABOVE_RUNS)  # at the threshold: no question
    with pytest.raises(InputError, match="no terminal to ask"):
        consent(ASK_ABOVE_RUNS + 1)
    consent(603, yes=True)
    consent(603, max_runs=603)
    with pytest.raises(InputError, match="603 runs exceed --max-runs 602"):
        consent(603, max_runs=602)
    with pytest.raises(InputError, match="no terminal"):  # a long estimate asks too
        _consent(argparse.Namespace(yes=False, max_runs=None), 3, 11 * 60 * 1000.0)


class Counted:
    """A backend stand-in that counts 100 tokens a message (estimated)."""

    name = "stub"

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        return TokenCount(100 * len(messages), estimated=True)


def test_the_estimate_is_every_cold_run_with_its_whole_answer() -> None:
    messages = (
        Message("system", "s"),
        *(Message("user", "q1"), Message("assistant", "a1")),
        *(Message("user", "q2"), Message("assistant", "a2")),
        Message("user", "q3"),
    )
    settings = Settings(max_tokens=11)
    ablation = Ablation(Counted(), settings, messages)  # type: ignore[arg-type]
    # full (6 messages), no system (5), no exchange 1 (4), no exchange 2 (4)
    assert [len(v.messages) for v in ablation.variants] == [6, 5, 4, 4]
    assert ablation.runs(2) == 8
    rates = Rates(prefill_tok_s=1000.0, decode_tok_s=50.0, samples=3)
    # prefill: 600 + 500 + 400 + 400 tokens at 1 ms each; decode: 10 steps after the
    # first token at 20 ms, 200 ms a run; twice
    assert ablation.estimate_ms(2, rates) == pytest.approx(2 * (1900 + 4 * 200))
    assert ablation.estimate_ms(2, Rates(None, 50.0, 0)) is None  # not measured: unknown


def test_a_duration_reads_as_a_person_says_it() -> None:
    assert duration(59_400) == "59 s"
    assert duration(3_599_000) == "1 h"  # not "60 min", nor "0 h 60 min"
    assert duration(7_620_000) == "2 h 7 min"
    assert duration(150_000) == "2 min"  # 2.5 rounds to even


class Chars:
    """A backend stand-in that counts a token a character."""

    name = "stub"

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        return TokenCount(sum(len(m.content) for m in messages), estimated=False)


def test_a_variant_that_keeps_part_of_the_system_message_counts_that_part() -> None:
    system = Message("system", f"Be brief.\n\n{SUMMARY_HEADER}towers")  # 9 + 2 + header + 6
    messages = (system, Message("user", "and now?"))  # 8
    ablation = Ablation(Chars(), Settings(max_tokens=1), messages)  # type: ignore[arg-type]
    names = [v.cut.name if v.cut else "full" for v in ablation.variants]
    assert names == ["full", "system prompt", "summary"]
    rates = Rates(prefill_tok_s=1000.0, decode_tok_s=50.0, samples=3)  # 1 ms a token
    whole = len(system.content) + 8
    header = len(SUMMARY_HEADER)
    # full; without the prompt: header + summary + question; without the summary:
    # "Be brief." + question (max_tokens 1: no decode step)
    expected = whole + (header + 6 + 8) + (9 + 8)
    assert ablation.estimate_ms(1, rates) == pytest.approx(expected)
