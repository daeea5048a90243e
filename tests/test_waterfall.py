"""A remote TTFT as a waterfall (telemetry/waterfall.py), on figures worked out by hand,
chosen so that the neighbouring formulas (the TTFT less the server's parts without the
send, or the server's parts against the whole TTFT) give other answers; and what the
verdict makes of it (telemetry/verdict.py `wait`)."""

from __future__ import annotations

import pytest

from phasechat.backends.events import PartMeaning
from phasechat.telemetry.metrics import metrics_from_dict
from phasechat.telemetry.verdict import wait
from phasechat.telemetry.waterfall import (
    CONNECT,
    LOAD,
    OTHER,
    PREFILL,
    QUEUED,
    REST,
    SENT,
    Step,
    Waterfall,
    waterfall,
    waterfall_of,
)

#: the waterfall's names of the server's figures, as the metric set names them
SERVER_NAMES = {"queue_ms": "server_queue_ms", "prefill_ms": "server_prompt_ms",
                "load_ms": "server_load_ms", "source": "server_source"}  # fmt: skip


def fall(ttft: float, meanings: dict[str, PartMeaning] | None = None, **kw: object) -> Waterfall:
    """The waterfall of a TTFT of `ttft` ms with the figures `kw` (ours: `connect_ms`,
    `sent_ms`; the server's: `queue_ms`, `prefill_ms`, `server_ttft_ms`, `load_ms`, its
    `source`) and the server's own `meanings` of its parts, from a metric set's records."""
    figures: dict[str, object] = {SERVER_NAMES.get(k, k): v for k, v in kw.items()}
    for part, key in ((QUEUED, "queue"), (PREFILL, "prefill")):
        if meanings and part in meanings:
            figures |= {f"server_{key}_name": meanings[part].name,
                        f"server_{key}_means": meanings[part].means}  # fmt: skip
    m = metrics_from_dict({"ttft_ms": ttft, **figures})
    got = waterfall(m.timing, m.server)
    assert got is not None
    return got


def parts(ttft: float, **kw: float | None) -> dict[str, float | None]:
    return {s.name: s.ms for s in fall(ttft, **kw).steps}  # type: ignore[arg-type]


def test_each_part_in_order_and_the_rest_is_after_the_send() -> None:
    # sent at 3 ms (connect 2, writing 1): the server had 247 ms, used 40 + 120
    got = fall(250.0, connect_ms=2.0, sent_ms=3.0, queue_ms=40.0, prefill_ms=120.0)
    assert [s.name for s in got.steps] == [CONNECT, SENT, QUEUED, PREFILL, REST]
    assert [s.ms for s in got.steps] == [2.0, 1.0, 40.0, 120.0, 87.0]  # not 90: the send
    assert sum(s.ms or 0 for s in got.steps) == 250.0
    assert got.contradiction is None


def test_the_servers_own_ttft_beyond_its_parts_is_its_other_time() -> None:
    got = parts(
        250.0, connect_ms=0.0, sent_ms=3.0, queue_ms=40.0, prefill_ms=120.0, server_ttft_ms=180.0
    )
    assert got[OTHER] == 20.0
    assert got[REST] == 67.0  # 247 - 180, not 247 - 160
    assert got[CONNECT] == 0.0 and got[SENT] == 3.0  # a kept-alive connection


def test_without_the_servers_figures_the_rest_is_all_after_the_send() -> None:
    got = parts(250.0, connect_ms=5.0, sent_ms=6.0)
    assert got == {CONNECT: 5.0, SENT: 1.0, REST: 244.0}


def test_server_parts_that_together_outlast_the_clients_wait_are_a_contradiction() -> None:
    # each fits in the 98 ms the server can have had from the connection's opening (with
    # the clocks' slack), together (120 ms) they do not: both are unknown, and so is the rest
    got = fall(100.0, connect_ms=2.0, sent_ms=3.0, queue_ms=40.0, prefill_ms=80.0)
    assert got.contradiction is not None and "queued + prefill 120 ms" in got.contradiction
    assert "98 ms" in got.contradiction
    assert {s.name: s.ms for s in got.steps}[QUEUED] is None
    assert {s.name: s.ms for s in got.steps}[PREFILL] is None
    assert {s.name: s.ms for s in got.steps}[REST] is None


def test_one_part_longer_than_the_whole_wait_is_named() -> None:
    got = fall(250.0, sent_ms=3.0, queue_ms=300.0, prefill_ms=10.0, source="SGLang")
    assert got.contradiction is not None
    assert got.contradiction.startswith("contradiction: SGLang says queued 300 ms")


def test_a_part_within_the_clocks_slack_is_believed_and_leaves_no_rest() -> None:
    got = parts(100.0, sent_ms=3.0, queue_ms=100.0)  # 100 <= 97 x 1.05 + 1
    assert got[QUEUED] == 100.0 and got[REST] == 0.0


@pytest.mark.parametrize(("queue", "dominant"), [(200.0, QUEUED), (110.0, None)])
def test_a_part_of_half_the_ttft_or_more_dominates(queue: float, dominant: str | None) -> None:
    # 110 + 20 leaves 118 of the 248 after the send: no part reaches 125
    got = fall(250.0, sent_ms=2.0, queue_ms=queue, prefill_ms=20.0)
    top = got.dominant()
    assert (top.name if top else None) == dominant


def remote(**fields: object) -> dict[str, object]:
    base = {"backend": "openai", "model": "m", "ttft_ms": 250.0, "e2e_ms": 900.0}
    return {**base, "headers_ms": 5.0, "connect_ms": 1.0, "sent_ms": 2.0, **fields}


def test_the_verdict_names_the_queue_when_it_dominates() -> None:
    m = metrics_from_dict(remote(server_queue_ms=200.0, server_prompt_ms=30.0))
    assert wait(m).startswith("the queue: 200 of the 250 ms TTFT")


def test_the_verdict_names_the_transport_only_where_the_server_accounts_for_its_part() -> None:
    said = metrics_from_dict(remote(server_queue_ms=10.0, server_prompt_ms=30.0))
    assert wait(said).startswith("the transport: 210 of the 250 ms TTFT")  # 1 + 1 + 208
    assert wait(metrics_from_dict(remote())) == ""  # the server said nothing of itself


def test_the_verdict_names_split_workers() -> None:
    m = metrics_from_dict(
        remote(server_prompt_ms=30.0, server_prefill_worker="7", server_decode_worker="9")
    )
    assert wait(m).endswith("prefill on worker 7, decode on worker 9 (disaggregated)")


def test_a_local_answer_has_no_waterfall() -> None:
    assert waterfall_of(metrics_from_dict({"backend": "local", "ttft_ms": 50.0})) is None


@pytest.mark.parametrize(("queue", "dominant"), [(50.0, QUEUED), (49.9, None), (51.0, QUEUED)])
def test_a_part_of_exactly_half_the_ttft_dominates(queue: float, dominant: str | None) -> None:
    """Issue 49: at the bound (50 of 100 ms) and just below it."""
    steps = (Step(QUEUED, queue, "server"), Step(PREFILL, 20.0, "server"))
    got = Waterfall(100.0, (*steps, Step(REST, 80.0 - queue, "here")))
    top = got.dominant()
    assert (top.name if top else None) == dominant
    assert Waterfall(0.0, steps).dominant() is None


def test_float_noise_is_zero_not_a_part() -> None:
    # Dynamo's own figures for one answer: its ttft_ms is its two parts exactly, and
    # 21.76124 - (3.1881869999999997 + 18.573052999999998) is 3.6e-15 in floats
    queue, prefill, ttft = 3.1881869999999997, 18.573052999999998, 21.76124
    assert ttft - (queue + prefill) > 0  # the noise is there
    got = fall(
        31.0, connect_ms=7.0, sent_ms=8.0, queue_ms=queue, prefill_ms=prefill, server_ttft_ms=ttft
    )
    assert [s.name for s in got.steps] == [CONNECT, SENT, QUEUED, PREFILL, REST]
    assert got.ms(REST) == pytest.approx(31.0 - 8.0 - ttft)
    # a thousandth of a millisecond left over is time (a microsecond): a part
    said = fall(31.0, sent_ms=8.0, queue_ms=3.0, prefill_ms=18.0, server_ttft_ms=21.001)
    assert said.ms(OTHER) == pytest.approx(0.001)
    # a rest of noise is zero: the server's parts fill the time after the send
    full = fall(21.76124 + 8.0, sent_ms=8.0, queue_ms=queue, prefill_ms=prefill)
    assert full.ms(REST) == 0.0


def test_a_server_s_own_parts_are_shown_under_its_names_and_definitions() -> None:
    route = PartMeaning("frontend: tokenize + route", "receipt to dispatch")
    worker = PartMeaning("worker: queue + prefill", "dispatch to first token")
    got = fall(
        100.0,
        connect_ms=0.0,
        sent_ms=2.0,
        queue_ms=5.0,
        prefill_ms=70.0,
        meanings={QUEUED: route, PREFILL: worker},
    )
    assert got.line() == (
        "TTFT 100 ms = connect 0 · request sent 2 · frontend: tokenize + route 5 · "
        "worker: queue + prefill 70 · the rest 23 ms"
    )
    assert got.ms(QUEUED) == 5.0  # found by its place, whatever it is called
    steps = got.as_dict()["steps"]
    assert isinstance(steps, list)
    assert steps[2] == {
        "name": QUEUED, "ms": 5.0, "source": "the server",
        "label": route.name, "means": route.means,
    }  # fmt: skip
    assert "label" not in steps[0]  # our own parts keep their names
    # the verdict says the dominant part as the server defines it, never "the queue"
    m = metrics_from_dict(
        {
            "ttft_ms": 100.0, "headers_ms": 90.0, "sent_ms": 2.0, "server_queue_ms": 80.0,
            "server_prompt_ms": 10.0, "server_source": "Dynamo nvext",
            "server_queue_name": route.name, "server_queue_means": route.means,
            "server_prefill_name": worker.name, "server_prefill_means": worker.means,
        }
    )  # fmt: skip
    said = wait(m)
    assert said.startswith(
        "frontend: tokenize + route: 80 of the 100 ms TTFT (receipt to dispatch)"
    )
    assert "queue" not in said.replace("queue + prefill", "")
    # a contradiction names them too
    bad = fall(10.0, sent_ms=1.0, queue_ms=50.0, meanings={QUEUED: route})
    assert bad.contradiction is not None and "frontend: tokenize + route 50 ms" in bad.contradiction
    assert [s.shown for s in bad.steps][2] == route.name


def test_a_body_sent_stamp_that_trails_the_servers_receipt_is_no_contradiction() -> None:
    """The body's "all written" stamp is taken after the write returns: on a busy client
    it can come after the server began (seen at load 8: 42 ms, with the server's own 74 ms
    in a TTFT of 94). The server's parts fit from the connection's opening: they stand,
    and the request's sending is what is left of the wait beside them."""
    got = fall(94.0, connect_ms=0.0, sent_ms=42.0, queue_ms=4.0, prefill_ms=50.0,
                    server_ttft_ms=74.0)  # fmt: skip
    assert got.contradiction is None
    steps = {s.name: s.ms for s in got.steps}
    assert (steps[QUEUED], steps[PREFILL], steps[OTHER]) == (4.0, 50.0, 20.0)
    assert steps[SENT] == 20.0 and steps[REST] == 0.0  # 94 - 74, nothing left after


def test_a_metric_sets_waterfall_whole_each_part_with_who_said_it() -> None:
    m = metrics_from_dict(
        {
            "ttft_ms": 250.0, "headers_ms": 240.0, "connect_ms": 2.0, "sent_ms": 5.0,
            "server_load_ms": 100.0, "server_queue_ms": 40.0, "server_prompt_ms": 60.0,
            "server_ttft_ms": 210.0, "server_source": "Ollama", "server_queue_name": "wait",
        }
    )  # fmt: skip
    got = waterfall_of(m)
    assert got is not None and got.as_dict() == {
        "ttft_ms": 250.0,
        "steps": [
            {"name": CONNECT, "ms": 2.0, "source": "measured here"},
            {"name": SENT, "ms": 3.0, "source": "measured here"},
            {"name": LOAD, "ms": 100.0, "source": "Ollama"},
            {"name": QUEUED, "ms": 40.0, "source": "Ollama", "label": "wait", "means": ""},
            {"name": PREFILL, "ms": 60.0, "source": "Ollama"},
            {"name": OTHER, "ms": 10.0, "source": "Ollama"},  # 210 - 200
            {"name": REST, "ms": 35.0, "source": "measured here"},  # 248 - 210 - 3
        ],
        "headers_ms": 240.0,
        "contradiction": None,
    }


def test_a_contradiction_whole_names_every_claim_and_leaves_each_server_part_unknown() -> None:
    m = metrics_from_dict(
        {"ttft_ms": 100.0, "headers_ms": 90.0, "sent_ms": 2.0, "server_queue_ms": 150.0,
         "server_ttft_ms": 120.0, "server_source": "SGLang"}
    )  # fmt: skip
    got = waterfall_of(m)
    assert got is not None and got.as_dict() == {
        "ttft_ms": 100.0,
        "steps": [
            {"name": CONNECT, "ms": None, "source": "measured here"},
            {"name": SENT, "ms": 2.0, "source": "measured here"},
            {"name": QUEUED, "ms": None, "source": "SGLang"},
            {"name": PREFILL, "ms": None, "source": "SGLang"},
            {"name": REST, "ms": None, "source": "measured here"},
        ],
        "headers_ms": 90.0,
        "contradiction": "contradiction: SGLang says queued 150 ms, time to first token 120 ms, "
        "longer than the 100 ms from the request's send to its first token measured here: "
        "its figures are unknown",
    }
    assert (
        got.line()
        == "TTFT 100 ms = connect ? · request sent 2 · queued ? · prefill ? · the rest ? ms"
    )


def test_a_waterfall_needs_a_first_token_and_the_response_s_headers() -> None:
    answer = {"backend": "openai", "headers_ms": 0.2}
    assert waterfall_of(metrics_from_dict(answer)) is None  # no first token
    assert waterfall_of(metrics_from_dict({**answer, "ttft_ms": 0.0})) is None
    short = waterfall_of(metrics_from_dict({**answer, "ttft_ms": 0.5, "sent_ms": 0.25}))
    assert short is not None  # under a millisecond is still a wait
    assert [(s.name, s.ms) for s in short.steps] == [(CONNECT, None), (SENT, 0.25), (REST, 0.25)]
    assert (short.headers_ms, short.steps[-1].source) == (0.2, "measured here")
    unsent = waterfall_of(metrics_from_dict({**answer, "ttft_ms": 5.0}))
    assert unsent is not None and unsent.ms(REST) == 5.0  # no send's stamp: all of it
    # without the send's stamp the rest is all the server left over
    said = fall(100.0, queue_ms=10.0, prefill_ms=20.0)
    assert [(s.name, s.ms) for s in said.steps][-1] == (REST, 70.0)


def test_a_send_that_trailed_the_server_keeps_less_than_a_millisecond() -> None:
    got = fall(50.0, connect_ms=0.0, sent_ms=49.5, queue_ms=49.5)
    assert [(s.name, s.ms, s.source) for s in got.steps] == [
        (CONNECT, 0.0, "measured here"),
        (SENT, 0.5, "measured here"),  # what the server's 49.5 ms left of the 50
        (QUEUED, 49.5, "the server"),
        (REST, 0.0, "measured here"),
    ]
