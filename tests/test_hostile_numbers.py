"""Numbers no engine could have sent, and bodies built to crash a parser: each is
ignored, named with its server in one notice, and never drawn as fact; nothing raises.

Tested at the wire parser, through the turn controller (as the TUI and `ask` run it),
as the `phasechat` command, in the sweep and in the TUI. The hostile bodies are in
tests/fault_numbers.py, served raw by tests/fault_server.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from phasechat.backends.events import (
    Message,
    Notice,
    PrefillProgress,
    ServerTimings,
    TextDelta,
    Usage,
)
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.backends.remote.http_errors import parse_retry_after
from phasechat.backends.remote.openai_wire import parse_chunk
from phasechat.backends.remote.servers.llama_server.render import render_on_llama_server
from phasechat.backends.remote.wire_numbers import MAX_RETRY_AFTER_S, as_count, as_ms, load_json
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings
from phasechat.chat.turns import Exchange, TurnController
from phasechat.cli import main as cli_main
from phasechat.cli.main import main
from phasechat.telemetry.metrics import Metrics
from phasechat.tui.app import PhasechatApp
from tests.fault_numbers import BY_THE_PROMPT, STREAMS
from tests.fault_server import FaultServer, fault_server_thread
from tests.helpers import stored_messages
from tests.test_cli import phasechat
from tests.test_tui_faults import screen_text, wait_for

SERVER = "http://203.0.113.9:8080/v1"


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as s:
        yield s


def figures(m: Metrics) -> dict[str, float]:
    """Every number the metric set holds (what any view may draw)."""
    out: dict[str, float] = {}
    for key, value in m.as_dict().items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
    return out


def assert_plausible(m: Metrics) -> None:
    """No figure negative, infinite, NaN or astronomically large."""
    for key, value in figures(m).items():
        assert math.isfinite(value) and 0 <= value < 1e8, (key, value)


# -- at the wire ------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(STREAMS))
def test_the_parser_ignores_each_hostile_value_and_names_it(case: str) -> None:
    raw, field = STREAMS[case]
    events = parse_chunk(raw, SERVER)
    notices = [e.text for e in events if isinstance(e, Notice)]
    if field is None:
        assert notices == []
    else:
        (notice,) = notices
        assert field in notice and SERVER in notice, notice
    for e in events:
        if isinstance(e, Usage):
            counts = (e.prompt_tokens, e.completion_tokens, e.cached_tokens, e.reasoning_tokens)
            assert all(n is None or 0 <= n <= 16 * 1024 * 1024 for n in counts), e
            if e.cached_tokens is not None:
                assert e.prompt_tokens is not None and e.cached_tokens <= e.prompt_tokens
            if e.reasoning_tokens is not None:
                assert e.completion_tokens is not None
                assert e.reasoning_tokens <= e.completion_tokens
        if isinstance(e, ServerTimings):
            for t in (e.prompt_ms, e.predicted_ms):
                assert t is None or (math.isfinite(t) and t >= 0), e
            if e.draft_n_accepted is not None:
                assert e.draft_n is not None and e.draft_n_accepted <= e.draft_n
        assert not isinstance(e, PrefillProgress), "a progress with a bad total is dropped"
    if case == "surrogate":
        (text,) = [e.text for e in events if isinstance(e, TextDelta)]
        assert text == "\ufffd!" and text.encode("utf-8")


def test_a_plausible_event_passes_unchanged() -> None:
    raw = (
        '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
        '"prompt_tokens_details":{"cached_tokens":2}},"timings":{"prompt_n":3,'
        '"prompt_ms":2.5,"predicted_n":3,"predicted_ms":30,"cache_n":2,'
        '"draft_n":4,"draft_n_accepted":3}}'
    )
    assert parse_chunk(raw, SERVER) == [
        Usage(5, 3, 2, None),
        ServerTimings(3, 2.5, 3, 30.0, 2, 4, 3),
    ]


def test_counts_and_times_at_their_bounds() -> None:
    assert [as_count(v) for v in (0, 7, 7.0, 16 * 1024 * 1024)] == [0, 7, 7, 16 * 1024 * 1024]
    bad = (-1, 7.5, True, "7", None, math.nan, math.inf, 16 * 1024 * 1024 + 1, 10**400)
    assert [as_count(v) for v in bad] == [None] * len(bad)
    assert as_ms(0.25) == 0.25 and as_ms(10**400) is None and as_ms(-0.1) is None
    assert load_json("[" * 200_000) is load_json("{") is load_json("1" * 5000)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("1e999", None), ("nan", None), ("-5", 0.0), ("7", 7.0), ("99999", MAX_RETRY_AFTER_S)],
)
def test_retry_after_is_finite_and_capped(header: str, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


# -- through the turn controller ----------------------------------------------------------


async def ask(base_url: str, model: str) -> tuple[Exchange, RemoteBackend]:
    backend = RemoteBackend(RemoteConfig(base_url=base_url, model=model))
    turns = TurnController(backend, Settings(max_tokens=16))
    try:
        await backend.start()
        async for _ in turns.send("hello"):
            pass
    finally:
        await backend.aclose()
    return turns.exchanges[-1], backend


@pytest.mark.parametrize("case", sorted(STREAMS))
async def test_a_hostile_stream_is_answered_and_its_figures_stay_plausible(
    server: FaultServer, case: str
) -> None:
    ex, _ = await ask(server.base_url, f"numbers-{case}")
    assert ex.answer.status == "complete", ex.answer.error
    text = "tok tok tok "
    if case == "surrogate":
        text += "\ufffd!"
    assert ex.answer.content == text
    field = STREAMS[case][1] or BY_THE_PROMPT.get(case)
    named = [n for n in ex.trace.notices if "ignored" in n]
    assert len(named) == (0 if field is None else 1), ex.trace.notices
    if field is not None:
        assert field in named[0] and server.base_url in named[0]
    assert ex.metrics is not None
    assert_plausible(ex.metrics)
    if case == "tiny_time":  # 16M tokens in a nanosecond: no rate is drawn
        assert ex.metrics.server_prefill_tok_s is None


@pytest.mark.parametrize("case", ["surrogate", "usage_nan", "choices_int", "progress_text"])
def test_ask_prints_the_answer_and_names_what_it_ignored(case: str) -> None:
    with fault_server_thread() as srv:
        r = phasechat(
            "ask",
            "--backend",
            "openai",
            "--base-url",
            srv.base_url,
            "--model",
            f"numbers-{case}",
            "hi",
        )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and r.stdout.startswith("tok tok tok")
    field = STREAMS[case][1]
    if field is not None:
        (note,) = [ln for ln in r.stderr.splitlines() if "ignored" in ln]
        assert note.startswith("phasechat: note: ignored ") and field in note
    else:
        assert "\ufffd!" in r.stdout


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://[::1/v1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:99999/v1", "port 99999 is not 1-65535"),
        ("http://127.0.0.1:8080/v1\r", "control character"),
    ],
)
@pytest.mark.parametrize("verb", [["ask", "hi"], []])
def test_a_bad_base_url_is_one_line(url: str, says: str, verb: list[str]) -> None:
    # `verb` [] is the TUI: refused before it needs a terminal
    r = phasechat(*verb[:1], "--backend", "openai", "--base-url", url, *verb[1:])
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith("phasechat: bad base URL") and says in line


def test_an_absurd_context_is_one_line() -> None:
    r = phasechat("ask", "--backend", "openai", "--context", str(10**18), "hi")
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()  # the bound of the config file's context, one source
    assert line == "phasechat: --context 1000000000000000000: expected 16 to 16,777,216 tokens"


def test_the_sweep_draws_no_negative_figure(capsys: pytest.CaptureFixture[str]) -> None:
    with fault_server_thread() as srv:
        argv = ["bench", "--backend", "openai", "--base-url", srv.base_url]
        argv += ["--model", "numbers-usage_negative", "--max-tokens", "8"]
        assert main([*argv, "--sweep", "1,2", "--per-stream", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    for level in record["levels"]:
        for key, value in level.items():
            if isinstance(value, int | float):
                assert value >= 0 and math.isfinite(value), (key, value)
        assert level["total_output_tokens"] == 3 * level["completed"]


# -- the window ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("props_digits", "/props n_ctx (a 4000-digit number)"),
        ("props_huge", "/props n_ctx (a 19-digit number)"),
        ("props_deep", None),  # not JSON at all: nothing to name, nothing believed
        ("vllm_digits", "max_model_len (a 400-digit number)"),
        ("vllm_huge", "max_model_len (a 19-digit number)"),
        ("ollama_digits", "/api/show num_ctx ('5000 digits')"),
    ],
)
async def test_an_absurd_window_is_unknown_and_named(
    server: FaultServer, case: str, field: str | None
) -> None:
    base = f"http://127.0.0.1:{server.port}/window-{case}/v1"
    ex, backend = await ask(base, "ok-3")
    assert backend.window is None and backend.context_window is None
    assert ex.answer.status == "complete" and ex.answer.content == "tok tok tok "
    named = [n for n in ex.trace.notices if "ignored" in n]
    if field is None:
        assert named == []
    else:
        (notice,) = named
        assert field in notice and f"/window-{case}/v1" in notice


@pytest.mark.parametrize("case", ["props_drip", "show_drip", "models_drip"])
async def test_metadata_that_drips_leaves_the_window_unknown_and_the_chat_goes_on(
    server: FaultServer, case: str
) -> None:
    base = f"http://127.0.0.1:{server.port}/window-{case}/v1"
    ex, backend = await ask(base, "ok-3")
    assert backend.window is None
    assert ex.answer.status == "complete" and ex.answer.content == "tok tok tok "
    if case == "models_drip":
        assert any("took over 4 s" in n and "window are unknown" in n for n in ex.trace.notices)
    async with asyncio.timeout(60):  # the server sees the client leave; a leak fails here
        await server.drip_cut.wait()


# -- in the TUI ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "model", "shown"),
    [
        ("", "numbers-usage_negative", "ignored usage.prompt_tokens (-100)"),
        ("", "numbers-cache_huge", "ignored timings.cache_n (99999999)"),
        ("", "numbers-choices_int", "ignored choices (7)"),
        ("", "numbers-surrogate", "tok tok tok \ufffd!"),
        ("/window-props_digits", "ok-3", "ignored /props n_ctx (a 4000-digit number)"),
    ],
)
async def test_the_tui_names_what_it_ignored_and_draws_no_negative_figure(
    path: str, model: str, shown: str
) -> None:
    with fault_server_thread() as srv:
        base = f"http://127.0.0.1:{srv.port}{path}/v1"
        config = RemoteConfig(base_url=base, model=model, name="bad")
        app = PhasechatApp(BackendSpec("openai", remote=config), Settings(max_tokens=8))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(lambda: app.backend.state == "ready")
            app.chat.send("hi")
            await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
            screen = await screen_text(pilot)
            assert app.is_running
    assert app.turns.exchanges[0].answer.status == "complete"
    assert shown in screen
    assert re.search(r"-\d[\d,.]* (tok|cached|evaluated)", screen) is None, screen


async def test_an_unhandled_error_ends_the_tui_with_status_1_in_one_line() -> None:
    def boom() -> None:
        raise RuntimeError("boom\n\x1b]0;title\x07")

    async def answer_then_fail(app: PhasechatApp) -> None:
        async with app.run_test(size=(110, 40)) as pilot:
            await wait_for(lambda: app.backend.state == "ready")
            app.chat.send("hi")
            await wait_for(lambda: len(app.turns.exchanges) == 1 and not app.chat.generating)
            app.call_later(boom)
            await pilot.pause()

    with fault_server_thread() as srv:
        config = RemoteConfig(base_url=srv.base_url, model="ok-3", name="fine")
        app = PhasechatApp(BackendSpec("openai", remote=config), Settings(max_tokens=8))
        with pytest.raises(RuntimeError):  # run_test hands the error to the test
            await answer_then_fail(app)
    assert app.return_code == 1
    assert app.chat.last_error == "RuntimeError: boom ␛]0;title␇"
    assert [(m["role"], m["status"]) for m in stored_messages()] == [
        ("user", "complete"),
        ("assistant", "complete"),
    ]


# -- the prompt as llama-server renders it --------------------------------------------------


@pytest.mark.parametrize(
    ("template", "tokenized", "pieces"),
    [
        ('{"prompt":"a\\ud800"}', '{"tokens":[{"piece":"a"},{"piece":"\\ud800"}]}', 2),
        ('{"prompt":"ab"}', "[" * 200_000, None),
        ("[" * 200_000, "{}", None),
        ('{"prompt":"ab"}', '{"tokens":[{"piece":"a"},{"piece":7}]}', None),
    ],
)
async def test_a_hostile_render_is_unknown_or_replaced_never_raised(
    template: str, tokenized: str, pieces: int | None
) -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        said = template if request.url.path == "/apply-template" else tokenized
        return httpx.Response(200, content=said.encode())

    async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
        rendered = await render_on_llama_server(client, "http://x", {}, (Message("user", "a"),))
    if pieces is None:
        assert rendered is None
    else:
        assert rendered is not None and rendered.text == "a\ufffd"
        assert b"".join(rendered.pieces).decode() == rendered.text


@pytest.mark.parametrize(
    ("case", "kind", "says"),
    [
        ("status", "server", "HTTP 500 server error at"),
        ("whole", "protocol", "server did not stream (sent application/json"),
        ("event", "protocol", "malformed event from server: '[[[["),
    ],
)
async def test_json_nested_200000_deep_is_one_line(
    server: FaultServer, case: str, kind: str, says: str
) -> None:
    ex, _ = await ask(server.base_url, f"deep-{case}")
    assert ex.answer.status == "error" and ex.trace.error is not None
    assert ex.trace.error.kind == kind
    error = ex.answer.error or ""
    assert says in error and "\n" not in error and len(error) < 400


def test_a_defect_in_a_command_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object) -> int:  # stands for any defect no handler expected
        raise RuntimeError("boom\n\x1b[31m")

    monkeypatch.setattr(cli_main, "doctor", broken)
    assert main(["doctor"]) == 1
    assert capsys.readouterr().err == "phasechat: internal error: RuntimeError: boom ␛[31m\n"


async def test_a_listing_whose_headers_drip_fails_the_start_in_one_line(
    server: FaultServer,
) -> None:
    base = f"http://127.0.0.1:{server.port}/window-models_headdrip/v1"
    backend = RemoteBackend(RemoteConfig(base_url=base, model="ok-3", listing_timeout_s=1.0))
    try:
        await backend.start()
    finally:
        await backend.aclose()
    assert backend.state == "failed"
    assert backend.state_detail == f"no answer from {base} within 1 s"
    async with asyncio.timeout(60):  # the server sees the client leave; a leak fails here
        await server.drip_cut.wait()


def test_a_value_is_named_in_a_few_characters_whatever_it_is() -> None:
    deep = "[" * 900 + "]" * 900
    for choices, shown in [(deep, "a list"), ('"' + "x" * 10**6 + '"', repr("x" * 40))]:
        (notice,) = parse_chunk('{"choices":[' + choices + "]}", SERVER)
        assert isinstance(notice, Notice)
        assert notice.text == f"ignored choices[] ({shown}) from {SERVER}: not a plausible value"
