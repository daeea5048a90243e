"""Replaying a scripted chat (chat/trips/replay.py) on a scripted server: each turn's row
from the server's usage, the totals of a replay worked out by hand, and the wall time
without the user's think time between turns (a clock stepped by the test)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import phasechat.chat.trips.replay as replay_module
from phasechat.backends.events import (
    Event,
    Finished,
    GenerationRequest,
    StreamError,
    TextDelta,
    Usage,
)
from phasechat.chat.config.settings import Settings
from phasechat.chat.trim.summarize import Summary
from phasechat.chat.trips.replay import BenchResult, Script, TurnRow, load_script, replay
from phasechat.telemetry.metrics import metrics_from_dict
from tests.scripted import ScriptedBackend


class Growing(ScriptedBackend):
    """Turn n: a prompt of 100 n tokens, 100 (n - 1) of them cached, and 10 n out."""

    def __init__(self) -> None:
        super().__init__("server")
        self.turn = 0

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.turn += 1
        n = self.turn
        yield TextDelta(f"answer {n}")
        yield Usage(100 * n, 10 * n, 100 * (n - 1))
        yield Finished("stop")


async def test_the_wall_time_leaves_out_the_think_time_between_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the replay reads the clock at its start (100 s) and its end (105 s); three turns
    # have two think times between them (10 ms each): 5 - 0.02 = 4.98 s
    reads = iter([100.0, 105.0])
    monkeypatch.setattr(replay_module, "time", SimpleNamespace(perf_counter=lambda: next(reads)))
    script = Script("Be brief.", ("q1", "q2", "q3"))
    result = await replay(Growing(), script, Settings(), think_time_s=0.01, trim=False)
    assert result.wall_s == pytest.approx(4.98, abs=1e-9)
    totals = result.totals()
    assert totals["output_tokens"] == 60
    assert totals["output_tok_s"] == pytest.approx(60 / 4.98)
    rows = [(r.turn, r.copy, r.tokens.prompt_tokens, r.tokens.cached_tokens,
             r.tokens.evaluated_prompt_tokens) for r in result.rows]  # fmt: skip
    assert rows == [(1, 0, 100, 0, 100), (2, 0, 200, 100, 100), (3, 0, 300, 200, 100)]
    assert [
        (r.tokens.output_tokens, r.metrics.finish, r.error, r.trimmed) for r in result.rows
    ] == [
        (10, "stop", None, False),
        (20, "stop", None, False),
        (30, "stop", None, False),
    ]
    assert result.rows[1].metrics.prompt_tokens == 200


def row(turn: int, prompt: int, cached: int, ttft: float | None, out: int, **kw: object) -> TurnRow:
    m = metrics_from_dict({
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "evaluated_prompt_tokens": prompt - cached,
        "ttft_ms": ttft,
        "e2e_ms": None,
        "decode_tok_s": None,
        "output_tokens": out,
        "finish": "stop",
    })  # fmt: skip
    fields: dict[str, object] = {
        "turn": turn,
        "copy": 0,
        "tokens": m.tokens,
        "trimmed": False,
        "tokens_cut": 0,
        "trim_wait_ms": None,
        "trim_note": None,
        "error": None,
        "metrics": m,
    }
    return TurnRow(**(fields | kw))  # type: ignore[arg-type]


def test_the_totals_count_the_turns_that_did_not_fail() -> None:
    result = BenchResult(
        rows=[
            row(1, 100, 0, 300.0, 10),
            row(2, 200, 150, 100.0, 20, trimmed=True, trim_wait_ms=40.0),
            row(3, 300, 250, 200.0, 30, trim_wait_ms=10.0),
            row(4, 999, 0, 5000.0, 99, error="connection lost", trimmed=True),
        ],
        wall_s=4.0,
    )
    assert result.totals() == {
        "type": "summary",
        "turns": 4,
        "errors": 1,
        "prompt_tokens": 600,
        "cached_tokens": 400,
        "cached_share": pytest.approx(400 / 600),
        "evaluated_prompt_tokens": 200,
        "ttft_ms_mean": 200.0,  # of 300, 100 and 200 (not the failed turn's 5,000)
        "ttft_ms_max": 300.0,
        "trims": 2,  # a failed turn's trim is still a trim
        "trim_wait_ms": 50.0,
        "summaries": 0,
        "summary_ms": 0,
        "summary_output_tokens": 0,
        "output_tokens": 60,
        "wall_s": 4.0,
        "output_tok_s": 15.0,
    }
    assert result.summary_line() == (
        "total: 4 turns, 1 errors · prompt 600 · cached 400 (67%) · evaluated 200 · "
        "ttft mean 200 ms, max 300 ms · 2 trims, 0 summaries (0.0 s, waited 0.1 s) · "
        "output 60 tokens in 4.0 s = 15.0 tok/s aggregate"
    )
    assert result.rows[0].line() == (
        "turn   1  prompt    100  cached      0  evaluated    100  ttft     300 ms  "
        "decode      - tok/s  trimmed no"
    )


def test_a_script_is_checked_when_read(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"system": "s", "turns": ["a", "b"], "max_tokens": 5}))
    assert load_script(path) == Script("s", ("a", "b"), 5)
    for bad, why in (
        ({"turns": []}, "'turns' must be a non-empty list"),
        ({"turns": ["a", " "]}, "a turn is empty"),
        ({"turns": ["a"], "max_tokens": 0}, "'max_tokens' 0: expected 1 to 16,777,216"),
        ({"turns": ["a"], "system": 3}, "'system' must be a string"),
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=why):
            load_script(path)


class Refusing(Growing):
    """Refuses its second request before reading it (too long for its window)."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        if self.turn == 1:
            self.turn += 1
            yield StreamError("context_overflow", "the prompt is longer than the window")
            return
        async for event in super().stream(request, every_s=every_s):
            yield event


async def test_a_refused_turn_read_nothing_and_is_left_out_of_the_totals() -> None:
    result = await replay(Refusing(), Script("", ("q1", "q2", "q3")), Settings(), trim=False)
    refused = result.rows[1]
    # our own count of its prompt stands (the scripted count: 3 a message + len // 4),
    # but nothing was cached or evaluated
    t = refused.tokens
    assert (t.prompt_tokens, t.cached_tokens, t.evaluated_prompt_tokens) == (
        refused.metrics.prompt_tokens,
        None,
        None,
    )
    assert (refused.timing.ttft_ms, refused.error, refused.metrics.finish) == (
        None,
        "the prompt is longer than the window",
        "error",
    )
    totals = result.totals()
    assert (totals["turns"], totals["errors"]) == (3, 1)
    # the first and third turns: prompts 100 and 300 (the third with 200 cached), 10 +
    # 30 tokens out
    assert (totals["prompt_tokens"], totals["cached_tokens"], totals["output_tokens"]) == (
        400,
        200,
        40,
    )
    assert totals["evaluated_prompt_tokens"] == 200
    assert refused.line().endswith("· the prompt is longer than the window")


async def test_copies_of_the_chat_run_in_lockstep_each_row_numbered() -> None:
    seen: list[str] = []

    def row_seen(r: TurnRow) -> None:
        seen.append(f"{r.turn}/{r.copy}")

    result = await replay(Growing(), Script("s", ("q1", "q2")), Settings(), concurrency=3,
                          trim=False, on_row=row_seen)  # fmt: skip
    assert [(r.turn, r.copy) for r in result.rows] == [
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)
    ]  # fmt: skip
    assert seen == ["1/0", "1/1", "1/2", "2/0", "2/1", "2/2"]
    assert result.totals()["turns"] == 6
    assert result.rows[4].line().startswith("turn   2/1  prompt")


def test_a_rows_record_is_every_metric_then_its_own_fields_which_win() -> None:
    metrics = metrics_from_dict({"cached_tokens": 999, "server_source": "timings"})
    r = replace(row(2, 200, 150, 90.0, 20), metrics=metrics)
    record = r.record()
    assert record["type"] == "turn" and record["server_source"] == "timings"
    assert (record["turn"], record["cached_tokens"], record["evaluated_prompt_tokens"]) == (
        2,
        150,
        50,
    )
    assert "metrics" not in record


def test_a_rows_own_fields_are_in_its_record_and_its_line_under_their_names() -> None:
    """What `bench.trim --json` and the human line give a reader: each of the turn's own
    fields under its own name, with a value no other field has."""
    r = row(
        3,
        300,
        100,
        80.0,
        12,
        copy=2,
        trimmed=True,
        tokens_cut=41,
        trim_wait_ms=7.5,
        trim_note="summary waited",
        error="refused",
    )
    record = r.record()
    own = {k: record[k] for k in ("turn", "copy", "trimmed", "tokens_cut")}
    assert own == {"turn": 3, "copy": 2, "trimmed": True, "tokens_cut": 41}
    assert (record["trim_wait_ms"], record["trim_note"], record["error"]) == (
        7.5,
        "summary waited",
        "refused",
    )
    line = r.line()
    assert line.startswith("turn   3/2  prompt    300  cached    100  evaluated    200")
    assert line.endswith("  trimmed yes  · summary waited · refused")
    plain = replace(r, trimmed=False, trim_note=None, error=None).line()
    assert plain.endswith("  trimmed no")


class SaysThenFails(Growing):
    """Says its usage (100 prompt tokens, 40 of them cached), then fails: before its
    first token on the first turn (a refusal), after one token on the second."""

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.turn += 1
        if self.turn == 2:
            yield TextDelta("partial")
        yield Usage(100, 1, 40)
        yield StreamError("context_overflow", "the prompt is longer than the window")


async def test_only_a_turn_refused_before_its_first_token_is_said_to_have_read_nothing() -> None:
    result = await replay(SaysThenFails(), Script("", ("q1", "q2")), Settings(), trim=False)
    refused, failed = result.rows
    assert (refused.metrics.cached_tokens, refused.metrics.evaluated_prompt_tokens) == (40, 60)
    t = refused.tokens  # the server's usage said 40 cached, but nothing was read
    assert (t.prompt_tokens, t.cached_tokens, t.evaluated_prompt_tokens) == (100, None, None)
    assert (refused.record()["cached_tokens"], refused.record()["prompt_tokens"]) == (None, 100)
    t = failed.tokens  # it read the prompt and answered before it failed
    assert (failed.error, t.cached_tokens, t.evaluated_prompt_tokens) == (refused.error, 40, 60)
    assert failed.error == "the prompt is longer than the window"


def test_totals_without_a_figure_say_unknown_never_a_made_up_one() -> None:
    empty = BenchResult()
    t = empty.totals()
    assert (t["cached_share"], t["ttft_ms_mean"], t["ttft_ms_max"], t["output_tok_s"]) == (
        None, None, None, None,
    )  # fmt: skip
    # a turn whose server said no counts adds none; a summary without its e2e adds no time
    unsaid = replace(row(1, 0, 0, None, 4), tokens=metrics_from_dict({"output_tokens": 4}).tokens)
    summaries = [
        Summary("s", frozenset({1}), "b", "m", metrics_from_dict({"e2e_ms": 1500.0})),
        Summary("t", frozenset({2}), "b", "m", metrics_from_dict({})),
    ]
    result = BenchResult(rows=[unsaid], wall_s=2.0, summaries=summaries)
    t = result.totals()
    assert (t["prompt_tokens"], t["evaluated_prompt_tokens"], t["summary_ms"]) == (0, 0, 1500.0)
    assert result.summary_line() == (
        "total: 1 turns, 0 errors · prompt 0 · cached 0 · evaluated 0 · ttft mean - ms, max "
        "- ms · 0 trims, 2 summaries (1.5 s, waited 0.0 s) · output 4 tokens in 2.0 s = "
        "2.0 tok/s aggregate"
    )
    fast = replace(row(2, 10, 0, 5.0, 4), metrics=metrics_from_dict({"decode_tok_s": 12.34}))
    assert "decode   12.3 tok/s" in fast.line() and "prompt      - " in unsaid.line()
